// SPDX-License-Identifier: Apache-2.0
#include "link/shard_link.h"

#include <cstring>

#include "common/check.h"
#include "common/log.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

ClusterLayout from_wire(wire::ClusterLayout::Reader in) {
  ClusterLayout layout;
  layout.shard_index = ShardId(in.getShardIndex());
  for (auto address : in.getShardAddresses()) layout.shard_addresses.emplace_back(address.cStr());
  layout.split_bytes = in.getSplitBytes();
  layout.mode = psched::from_wire(in.getMode());
  layout.workers = in.getWorkers();
  layout.max_message_bytes = in.getMaxMessageBytes();
  layout.default_optimizer = psched::from_wire(in.getDefaultOptimizer());
  return layout;
}

void copy_value(capnp::Data::Reader value, std::byte* out, size_t out_bytes) {
  if (value.size() != out_bytes)
    fail(ErrorCode::shape_mismatch, "shard answered {} bytes where {} were expected", value.size(),
         out_bytes);
  std::memcpy(out, value.begin(), out_bytes);
}

// A fused call's per-partition error text ("[code] message"), or null for "".
std::exception_ptr error_of(capnp::Text::Reader text) {
  if (text.size() == 0) return nullptr;
  return std::make_exception_ptr(from_kj_exception(kj::Exception(
      kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::heapString(text.cStr(), text.size()))));
}

// Sets a push's (or pushPoll's) fields. `gradient` becomes a segment of the message when it
// is word-aligned and whole words (Cap'n Proto writes up to the next word boundary): zero copy,
// the caller keeps it alive until the call is answered. Otherwise it is copied.
template <typename Params>
void fill_push(Params params, VariableId variable, Step step, ElementRange range, DType dtype,
               std::span<const std::byte> gradient) {
  params.setVariable(variable.value);
  params.setStep(step.value);
  params.setOffset(range.begin);
  params.setDtype(to_wire(dtype));
  capnp::Data::Reader data(reinterpret_cast<const kj::byte*>(gradient.data()), gradient.size());
  if (reinterpret_cast<uintptr_t>(gradient.data()) % sizeof(capnp::word) == 0 &&
      gradient.size() % sizeof(capnp::word) == 0) {
    auto orphanage = capnp::Orphanage::getForMessageContaining(params);
    params.adoptData(orphanage.referenceExternalData(data));
  } else {
    params.setData(data);
  }
}

// A fused push's partitions; their gradients are copied into the message.
void fill_fused(capnp::List<wire::Partition>::Builder list, std::span<const FusedPartition> parts) {
  for (unsigned i = 0; i < parts.size(); ++i) {
    const FusedPartition& p = parts[i];
    list[i].setVariable(p.variable.value);
    list[i].setStep(p.step.value);
    list[i].setOffset(p.range.begin);
    list[i].setDtype(to_wire(p.dtype));
    list[i].setData(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(p.gradient.data()),
                                        p.gradient.size()));
  }
}

// Copies each answered value of a fused poll into its partition's `out`; one outcome per
// partition, in order.
std::vector<PollOutcome> take_values(capnp::List<wire::PolledValue>::Reader values,
                                     const std::vector<std::pair<std::byte*, size_t>>& outs) {
  if (values.size() != outs.size())
    fail(ErrorCode::internal, "shard answered {} values to a fused poll of {}", values.size(),
         outs.size());
  std::vector<PollOutcome> out;
  for (unsigned i = 0; i < values.size(); ++i) {
    PollOutcome outcome{error_of(values[i].getError()), values[i].getAppliedAtNs()};
    if (!outcome.error) {
      try {
        copy_value(values[i].getValue(), outs[i].first, outs[i].second);
      } catch (...) {
        outcome.error = std::current_exception();
      }
    }
    out.push_back(outcome);
  }
  return out;
}

// Where each partition's fresh value goes, and its size.
std::vector<std::pair<std::byte*, size_t>> outs_of(std::span<const FusedPartition> parts) {
  std::vector<std::pair<std::byte*, size_t>> outs;
  for (const FusedPartition& p : parts)
    outs.emplace_back(p.out, p.range.size() * element_bytes(p.dtype));
  return outs;
}

// `call(part)` for each of `parts`, all sent now; resolves with one outcome each, in order, or
// rejects when one was lost with its connection, as a fused call does (its caller resends the
// unfinished parts after reconnecting).
template <typename Call>
kj::Promise<std::vector<PollOutcome>> each_part(std::span<const FusedPartition> parts, Call call) {
  auto outcomes = kj::heapArrayBuilder<kj::Promise<PollOutcome>>(parts.size());
  for (const FusedPartition& p : parts)
    outcomes.add(call(p).then(
        [](int64_t applied_at_ns) {
          return PollOutcome{nullptr, applied_at_ns};
        },
        [](kj::Exception&& e) {
          return PollOutcome{std::make_exception_ptr(from_kj_exception(e)), 0};
        }));
  return kj::joinPromises(outcomes.finish()).then([](kj::Array<PollOutcome> all) {
    for (const PollOutcome& o : all)
      if (o.error && category(to_error(o.error).code()) == ErrorCategory::disconnected)
        kj::throwFatalException(to_kj_exception(o.error));
    return std::vector<PollOutcome>(all.begin(), all.end());
  });
}

template <typename... Args>
kj::Exception error(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  return to_kj_exception(
      std::make_exception_ptr(Error(code, fmt::format(format, std::forward<Args>(args)...))));
}

}  // namespace

// Refcounted: the link holds the current one, and each call holds the one it was sent on until
// the call's promise goes, so a lost connection is closed once its calls are done.
struct ShardLink::Connection : kj::Refcounted {
  Connection(kj::Own<kj::AsyncIoStream> stream, uint64_t max_message_bytes,
             kj::Timer* timer = nullptr)
      : rpc(kj::mv(stream), reader_options(max_message_bytes), timer),
        shard(rpc.bootstrap().castAs<wire::Shard>()) {}

  RpcConnection rpc;
  wire::Shard::Client shard;
  kj::Maybe<wire::Session::Client> session;
  kj::Own<DataChannel> data;  // null: everything goes over `rpc`
};

ShardLink::ShardLink(std::string address, StreamOpener open, uint64_t max_message_bytes,
                     ReconnectPolicy policy, bool data_stream, bool plain_sockets)
    : address_(std::move(address)),
      open_(std::move(open)),
      max_message_bytes_(max_message_bytes),
      policy_(policy),
      data_stream_(data_stream),
      plain_sockets_(plain_sockets) {
  PSCHED_REQUIRE(policy_.timer != nullptr, address_);
}

ShardLink::ShardLink(kj::Own<kj::AsyncIoStream> stream, uint64_t max_message_bytes)
    : address_("a hand-made link"),
      max_message_bytes_(max_message_bytes),
      connection_(kj::refcounted<Connection>(kj::mv(stream), max_message_bytes)) {}

ShardLink::~ShardLink() = default;

wire::Session::Client* ShardLink::session() {
  if (!connection_) return nullptr;
  KJ_IF_MAYBE (s, connection_->session) {
    return s;
  }
  return nullptr;
}

kj::Exception ShardLink::not_connected() {
  return error(ErrorCode::invalid_argument, "call before connect: the shard session is not open");
}

kj::Promise<ClusterLayout> ShardLink::connect(WorkerId worker, const std::string& token) {
  worker_ = worker;
  token_ = token;
  if (connection_) return present(*connection_);
  return connect_with_retries(policy_.timer->now() + policy_.timeout, policy_.first_delay, false);
}

kj::Promise<ClusterLayout> ShardLink::open_connection() {
  return open_().then([this](kj::Own<kj::AsyncIoStream> stream) {
    auto attempt = kj::refcounted<Connection>(kj::mv(stream), max_message_bytes_, policy_.timer);
    Connection& fresh = *attempt;
    return present(fresh)
        .then([this, &fresh](ClusterLayout layout) {
          return register_again(fresh)
              .then([this, &fresh]() -> kj::Promise<void> {
                if (!data_stream_) return kj::READY_NOW;
                return open_data(fresh, open_);
              })
              .then([layout = kj::mv(layout)]() mutable { return kj::mv(layout); });
        })
        .then([this, &fresh](ClusterLayout layout) {
          connection_ = kj::addRef(fresh);
          return layout;
        })
        .attach(kj::mv(attempt));
  });
}

kj::Promise<ClusterLayout> ShardLink::connect_with_retries(kj::TimePoint deadline,
                                                           kj::Duration delay, bool reconnecting) {
  return open_connection().catch_([this, deadline, delay,
                                   reconnecting](kj::Exception&& e) -> kj::Promise<ClusterLayout> {
    // A shard at limits.max_connections refuses with [overloaded]: worth waiting for. At
    // the start other refusals and an unreachable shard fail at once; a reconnect also
    // waits for the shard to come back.
    auto type = e.getType();
    bool retry = type == kj::Exception::Type::OVERLOADED ||
                 (reconnecting && type == kj::Exception::Type::DISCONNECTED);
    if (!retry) return kj::mv(e);
    if (policy_.timer->now() + delay >= deadline) {
      if (!reconnecting) return kj::mv(e);
      return error(ErrorCode::disconnected, "shard {} unreachable for {} s: {}", address_,
                   policy_.timeout / kj::SECONDS, e.getDescription().cStr());
    }
    if (!reconnecting)
      log_warn("worker {}: shard {} refused the connection, retrying in {} ms: {}", worker_.value,
               address_, delay / kj::MILLISECONDS, e.getDescription().cStr());
    return policy_.timer->afterDelay(delay).then([this, deadline, delay, reconnecting] {
      return connect_with_retries(deadline, std::min(delay * 2, policy_.max_delay), reconnecting);
    });
  });
}

kj::Promise<ClusterLayout> ShardLink::present(Connection& connection) {
  auto request = connection.shard.connectRequest();
  request.setWorkerId(worker_.value);
  request.setToken(token_);
  return request.send().then([&connection](capnp::Response<wire::Shard::ConnectResults> response) {
    connection.session = response.getSession();
    return from_wire(response.getLayout());
  });
}

kj::Promise<VariableId> ShardLink::register_part(const VariableSpec& spec,
                                                 bool use_server_optimizer, ElementRange part,
                                                 std::span<const std::byte> initial) {
  if (session() == nullptr) return not_connected();
  Registered registered{spec, use_server_optimizer, part, initial, VariableId()};
  return send_register(*connection_, registered)
      .then([this, registered](Registration answer) mutable {
        registered.id = answer.id;
        registered_.push_back(std::move(registered));
        return answer.id;
      })
      .attach(kj::addRef(*connection_));
}

kj::Promise<ShardLink::Registration> ShardLink::send_register(Connection& connection,
                                                              const Registered& part) {
  KJ_IF_MAYBE (session, connection.session) {
    auto request = session->registerRequest();
    to_wire(part.spec, part.use_server_optimizer, request.initSpec());
    request.setBegin(part.part.begin);
    request.setEnd(part.part.end);
    request.setInitialValue(capnp::Data::Reader(
        reinterpret_cast<const kj::byte*>(part.value.data()), part.value.size()));
    return request.send().then([](capnp::Response<wire::Session::RegisterResults> response) {
      return Registration{VariableId(response.getVariable()), response.getCreated()};
    });
  }
  return not_connected();
}

kj::Promise<void> ShardLink::recover(uint64_t failed_epoch) {
  if (failed_epoch < epoch_) return kj::READY_NOW;
  if (!open_)
    return error(ErrorCode::disconnected,
                 "the connection to {} was lost (this link cannot reconnect)", address_);
  if (recovering_now_) {
    KJ_IF_MAYBE (attempt, recovering_) {
      return attempt->addBranch();
    }
  }
  recovering_now_ = true;
  log_warn("worker {}: connection to shard {} lost, reconnecting", worker_.value, address_);
  kj::TimePoint deadline = policy_.timer->now() + policy_.timeout;
  recovering_ = connect_with_retries(deadline, policy_.first_delay, true)
                    .then(
                        [this](ClusterLayout) {
                          recovering_now_ = false;
                          ++epoch_;
                          log_info("worker {}: reconnected to shard {}", worker_.value, address_);
                        },
                        [this](kj::Exception&& e) {
                          recovering_now_ = false;
                          kj::throwFatalException(kj::mv(e));
                        })
                    .fork();
  KJ_IF_MAYBE (attempt, recovering_) {
    return attempt->addBranch();
  }
  KJ_UNREACHABLE;
}

kj::Promise<void> ShardLink::register_again(Connection& connection) {
  kj::Vector<kj::Promise<void>> answers;
  for (const Registered& part : registered_) {
    answers.add(send_register(connection, part)
                    .then([this, name = part.spec.name, id = part.id](Registration answer) {
                      if (answer.created || answer.id != id)
                        throw error(ErrorCode::bad_config,
                                    "shard {} came back without variable '{}' (restarted "
                                    "without a checkpoint directory?); the job cannot resume "
                                    "on it",
                                    address_, name);
                    }));
  }
  return kj::joinPromises(answers.releaseAsArray());
}

kj::Promise<void> ShardLink::open_data_stream(kj::Own<kj::AsyncIoStream> stream) {
  if (session() == nullptr) return not_connected();
  auto given = std::make_shared<kj::Own<kj::AsyncIoStream>>(kj::mv(stream));
  return open_data(*connection_,
                   [given]() -> kj::Promise<kj::Own<kj::AsyncIoStream>> { return kj::mv(*given); });
}

kj::Promise<void> ShardLink::open_data(Connection& connection, StreamOpener open) {
  KJ_IF_MAYBE (session, connection.session) {
    auto asked = session->openDataStreamRequest().send().then(
        [](capnp::Response<wire::Session::OpenDataStreamResults> r)
            -> kj::Promise<kj::Array<kj::byte>> { return kj::heapArray<kj::byte>(r.getKey()); },
        [this](kj::Exception&& e) -> kj::Promise<kj::Array<kj::byte>> {
          if (e.getType() != kj::Exception::Type::UNIMPLEMENTED) return kj::mv(e);
          log_info("worker {}: shard {} has no data streams; pushes and polls go as RPC calls",
                   worker_.value, address_);
          return kj::Array<kj::byte>();
        });
    return asked.then([this, &connection,
                       open = std::move(open)](kj::Array<kj::byte> key) -> kj::Promise<void> {
      if (key.size() == 0) return kj::READY_NOW;
      return open()
          .then([this, key = kj::mv(key)](kj::Own<kj::AsyncIoStream> stream) {
            return DataChannel::open(kj::mv(stream), key, max_message_bytes_, plain_sockets_);
          })
          .then([&connection](kj::Own<DataChannel> channel) { connection.data = kj::mv(channel); });
    });
  }
  return not_connected();
}

DataChannel* ShardLink::data() {
  return connection_ ? connection_->data.get() : nullptr;
}

kj::Promise<void> ShardLink::push(VariableId variable, Step step, ElementRange range, DType dtype,
                                  std::span<const std::byte> gradient) {
  if (session() == nullptr) return not_connected();
  if (DataChannel* channel = data())
    return channel
        ->send(
            {RequestKind::push, dtype, variable.value, 0, step.value, range.begin, gradient.size()},
            gradient)
        .ignoreResult()
        .attach(kj::addRef(*connection_));
  auto request = session()->pushRequest();
  fill_push(wire::Session::PushParams::Builder(request), variable, step, range, dtype, gradient);
  return request.send().ignoreResult().attach(kj::addRef(*connection_));
}

kj::Promise<int64_t> ShardLink::poll(VariableId variable, Step step, ElementRange range,
                                     std::byte* out, size_t out_bytes) {
  if (session() == nullptr) return not_connected();
  if (DataChannel* channel = data())
    return channel
        ->send({RequestKind::poll, DType::float32, variable.value, 0, step.value, range.begin,
                range.size()},
               {}, out, out_bytes)
        .attach(kj::addRef(*connection_));
  auto request = session()->pollRequest();
  request.setVariable(variable.value);
  request.setStep(step.value);
  request.setOffset(range.begin);
  request.setCount(range.size());
  return request.send()
      .then([out, out_bytes](capnp::Response<wire::Session::PollResults> r) {
        copy_value(r.getValue(), out, out_bytes);
        return r.getAppliedAtNs();
      })
      .attach(kj::addRef(*connection_));
}

kj::Promise<std::vector<std::exception_ptr>> ShardLink::push_fused(
    std::span<const FusedPartition> parts) {
  if (session() == nullptr) return not_connected();
  if (data() != nullptr)
    return each_part(parts,
                     [this](const FusedPartition& p) {
                       return push(p.variable, p.step, p.range, p.dtype, p.gradient).then([] {
                         return int64_t{0};
                       });
                     })
        .then([](std::vector<PollOutcome> outcomes) {
          std::vector<std::exception_ptr> out;
          for (const PollOutcome& o : outcomes) out.push_back(o.error);
          return out;
        });
  auto request = session()->pushFusedRequest();
  fill_fused(request.initPartitions(static_cast<unsigned>(parts.size())), parts);
  size_t count = parts.size();
  return request.send()
      .then([count](capnp::Response<wire::Session::PushFusedResults> r) {
        auto errors = r.getErrors();
        if (errors.size() != count)
          fail(ErrorCode::internal, "shard answered {} outcomes to a fused push of {}",
               errors.size(), count);
        std::vector<std::exception_ptr> out;
        for (auto text : errors) out.push_back(error_of(text));
        return out;
      })
      .attach(kj::addRef(*connection_));
}

kj::Promise<std::vector<PollOutcome>> ShardLink::poll_fused(std::span<const FusedPartition> parts) {
  if (session() == nullptr) return not_connected();
  if (data() != nullptr)
    return each_part(parts, [this](const FusedPartition& p) {
      return poll(p.variable, p.step, p.range, p.out, p.range.size() * element_bytes(p.dtype));
    });
  auto request = session()->pollFusedRequest();
  auto list = request.initRanges(static_cast<unsigned>(parts.size()));
  for (unsigned i = 0; i < parts.size(); ++i) {
    const FusedPartition& p = parts[i];
    list[i].setVariable(p.variable.value);
    list[i].setStep(p.step.value);
    list[i].setOffset(p.range.begin);
    list[i].setCount(p.range.size());
  }
  return request.send()
      .then([outs = outs_of(parts)](capnp::Response<wire::Session::PollFusedResults> r) {
        return take_values(r.getValues(), outs);
      })
      .attach(kj::addRef(*connection_));
}

kj::Promise<int64_t> ShardLink::push_poll(VariableId variable, Step step, ElementRange range,
                                          DType dtype, std::span<const std::byte> gradient,
                                          std::byte* out, size_t out_bytes) {
  if (session() == nullptr) return not_connected();
  if (DataChannel* channel = data())
    return channel
        ->send({RequestKind::push_poll, dtype, variable.value, 0, step.value, range.begin,
                gradient.size()},
               gradient, out, out_bytes)
        .attach(kj::addRef(*connection_));
  auto request = session()->pushPollRequest();
  fill_push(wire::Session::PushPollParams::Builder(request), variable, step, range, dtype,
            gradient);
  return request.send()
      .then([out, out_bytes](capnp::Response<wire::Session::PushPollResults> r) {
        copy_value(r.getValue(), out, out_bytes);
        return r.getAppliedAtNs();
      })
      .attach(kj::addRef(*connection_));
}

kj::Promise<std::vector<PollOutcome>> ShardLink::push_poll_fused(
    std::span<const FusedPartition> parts) {
  if (session() == nullptr) return not_connected();
  if (data() != nullptr)
    return each_part(parts, [this](const FusedPartition& p) {
      return push_poll(p.variable, p.step, p.range, p.dtype, p.gradient, p.out,
                       p.range.size() * element_bytes(p.dtype));
    });
  auto request = session()->pushPollFusedRequest();
  fill_fused(request.initPartitions(static_cast<unsigned>(parts.size())), parts);
  return request.send()
      .then([outs = outs_of(parts)](capnp::Response<wire::Session::PushPollFusedResults> r) {
        return take_values(r.getValues(), outs);
      })
      .attach(kj::addRef(*connection_));
}

kj::Promise<void> ShardLink::pull(VariableId variable, ElementRange range, std::byte* out,
                                  size_t out_bytes) {
  if (session() == nullptr) return not_connected();
  auto request = session()->pullRequest();
  request.setVariable(variable.value);
  request.setOffset(range.begin);
  request.setCount(range.size());
  return request.send()
      .then([out, out_bytes](capnp::Response<wire::Session::PullResults> r) {
        copy_value(r.getValue(), out, out_bytes);
      })
      .attach(kj::addRef(*connection_));
}

}  // namespace psched
