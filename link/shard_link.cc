// SPDX-License-Identifier: Apache-2.0
#include "link/shard_link.h"

#include <cstring>

#include "common/check.h"
#include "common/log.h"
#include "link/data_channel.h"
#include "link/rpc_calls.h"
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
  layout.job = in.getJob();
  std::vector<uint32_t> owners;
  for (uint16_t owner : in.getSlotOwners()) owners.push_back(owner);
  layout.slot_map = SlotMap(in.getSlotEpoch(), in.getShardAddresses().size(), std::move(owners));
  return layout;
}

void copy_value(capnp::Data::Reader value, std::byte* out, size_t out_bytes) {
  if (value.size() != out_bytes)
    fail(ErrorCode::shape_mismatch, "shard answered {} bytes where {} were expected", value.size(),
         out_bytes);
  std::memcpy(out, value.begin(), out_bytes);
}

// Sends `request` (a pull or a poll, its other fields set) for `range` of `variable` and copies
// the answer's value into `out`.
template <typename Request>
kj::Promise<void> ask_value(Request request, VariableId variable, ElementRange range,
                            std::byte* out, size_t out_bytes) {
  request.setVariable(variable.value);
  request.setOffset(range.begin);
  request.setCount(range.size());
  return request.send().then(
      [out, out_bytes](auto answer) { copy_value(answer.getValue(), out, out_bytes); });
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
  kj::Own<RpcCalls> calls;    // over `session`, once presented
  kj::Own<DataChannel> data;  // null: pushes and polls go as `calls`

  DataPath& path() { return data ? static_cast<DataPath&>(*data) : *calls; }
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
  attempt_reached_shard_ = false;
  return open_().then([this](kj::Own<kj::AsyncIoStream> stream) {
    attempt_reached_shard_ = true;
    auto attempt = kj::refcounted<Connection>(kj::mv(stream), max_message_bytes_, policy_.timer);
    Connection& fresh = *attempt;
    return present(fresh)
        .then([this, &fresh](ClusterLayout layout) -> kj::Promise<ClusterLayout> {
          // A reconnection must reach the shard the variables were placed by, before anything
          // is registered again there.
          KJ_IF_MAYBE (first, layout_) {
            if (std::string why = shard_change(*first, layout); !why.empty())
              return error(ErrorCode::bad_config,
                           "shard {} cannot be used again: {}; restart the worker to take the "
                           "job's placement anew",
                           address_, why);
          }
          return register_again(fresh)
              .then([this, &fresh]() -> kj::Promise<void> {
                if (!data_stream_) return kj::READY_NOW;
                return open_data(fresh, open_);
              })
              .then([layout = kj::mv(layout)]() mutable { return kj::mv(layout); });
        })
        .then([this, &fresh](ClusterLayout layout) {
          if (layout_ == nullptr) layout_ = layout;  // the first connection that became the link's
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
    // A shard at limits.max_connections refuses with [overloaded]: worth waiting for. So is a
    // connection lost after it reached the shard (cut while it was set up). At the start other
    // refusals and an unreachable shard fail at once; a reconnect also waits for the shard to
    // come back.
    auto type = e.getType();
    bool retry =
        type == kj::Exception::Type::OVERLOADED ||
        (type == kj::Exception::Type::DISCONNECTED && (reconnecting || attempt_reached_shard_));
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
    connection.calls = kj::heap<RpcCalls>(response.getSession());
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

kj::Promise<void> ShardLink::recover(uint64_t failed_epoch, std::string_view why) {
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
  log_warn("worker {}: connection to shard {} lost{}, reconnecting", worker_.value, address_,
           why.empty() ? std::string() : fmt::format(" ({})", why));
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

kj::Promise<VariableId> ShardLink::register_table(const TableSpec& spec) {
  if (session() == nullptr) return not_connected();
  return send_register_table(*connection_, spec)
      .then([this, spec](Registration answer) {
        tables_.push_back({spec, answer.id});
        return answer.id;
      })
      .attach(kj::addRef(*connection_));
}

kj::Promise<ShardLink::Registration> ShardLink::send_register_table(Connection& connection,
                                                                    const TableSpec& spec) {
  KJ_IF_MAYBE (session, connection.session) {
    auto request = session->registerTableRequest();
    to_wire(spec, request.initSpec());
    return request.send().then([](capnp::Response<wire::Session::RegisterTableResults> response) {
      return Registration{VariableId(response.getTable()), response.getCreated()};
    });
  }
  return not_connected();
}

kj::Promise<void> ShardLink::register_again(Connection& connection) {
  kj::Vector<kj::Promise<void>> answers;
  for (const auto& [spec, id] : tables_) {
    answers.add(send_register_table(connection, spec)
                    .then([this, name = spec.name, id = id](Registration answer) {
                      if (answer.created || answer.id != id)
                        throw error(ErrorCode::bad_config,
                                    "shard {} came back without table '{}' (restarted without a "
                                    "checkpoint directory?); the job cannot resume on it",
                                    address_, name);
                    }));
  }
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
            return DataChannel::open(kj::mv(stream), key, max_message_bytes_, plain_sockets_)
                .catch_([](kj::Exception&& e) -> kj::Promise<kj::Own<DataChannel>> {
                  // The key was just given: unknown, it went with its session's connection.
                  if (from_kj_exception(e).code() != ErrorCode::bad_token) return kj::mv(e);
                  return error(ErrorCode::disconnected,
                               "the data stream's session was lost while it opened: {}",
                               e.getDescription().cStr());
                });
          })
          .then([&connection](kj::Own<DataChannel> channel) { connection.data = kj::mv(channel); });
    });
  }
  return not_connected();
}

DataPath* ShardLink::data_path() {
  return session() != nullptr ? &connection_->path() : nullptr;
}

kj::Own<void> ShardLink::hold() {
  return kj::addRef(*connection_);
}

bool ShardLink::has_data_stream() {
  return connection_ && connection_->data;
}

kj::Promise<void> ShardLink::pull(VariableId variable, ElementRange range, std::byte* out,
                                  size_t out_bytes, Step after) {
  if (session() == nullptr) return not_connected();
  kj::Promise<void> answered = nullptr;
  if (after != Step()) {
    auto request = session()->pollRequest();
    request.setStep(after.value);
    answered = ask_value(kj::mv(request), variable, range, out, out_bytes);
  } else {
    answered = ask_value(session()->pullRequest(), variable, range, out, out_bytes);
  }
  return answered.attach(kj::addRef(*connection_));
}

kj::Promise<Step> ShardLink::join(Step at_least) {
  if (session() == nullptr) return not_connected();
  auto request = session()->joinRequest();
  request.setAtLeast(at_least.value);
  return request.send()
      .then([](capnp::Response<wire::Session::JoinResults> r) { return Step(r.getStep()); })
      .attach(kj::addRef(*connection_));
}

}  // namespace psched
