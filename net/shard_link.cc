#include "net/shard_link.h"

#include <cstring>

#include "common/check.h"
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

}  // namespace

ShardLink::ShardLink(kj::Own<kj::AsyncIoStream> stream, uint64_t max_message_bytes)
    : connection_(kj::mv(stream), reader_options(max_message_bytes)),
      shard_(connection_.bootstrap().castAs<wire::Shard>()) {}

wire::Session::Client* ShardLink::session() {
  KJ_IF_MAYBE (s, session_) {
    return s;
  }
  return nullptr;
}

kj::Exception ShardLink::not_connected() {
  return to_kj_exception(std::make_exception_ptr(
      Error(ErrorCode::invalid_argument, "call before connect: the shard session is not open")));
}

kj::Promise<ClusterLayout> ShardLink::connect(WorkerId worker, const std::string& token) {
  auto request = shard_.connectRequest();
  request.setWorkerId(worker.value);
  request.setToken(token);
  return request.send().then([this](capnp::Response<wire::Shard::ConnectResults> response) {
    session_ = response.getSession();
    return from_wire(response.getLayout());
  });
}

kj::Promise<VariableId> ShardLink::register_part(const VariableSpec& spec,
                                                 bool use_server_optimizer, ElementRange part,
                                                 std::span<const std::byte> initial) {
  if (session() == nullptr) return not_connected();
  auto request = session()->registerRequest();
  to_wire(spec, use_server_optimizer, request.initSpec());
  request.setBegin(part.begin);
  request.setEnd(part.end);
  request.setInitialValue(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(initial.data()), initial.size()));
  return request.send().then([](capnp::Response<wire::Session::RegisterResults> response) {
    return VariableId(response.getVariable());
  });
}

kj::Promise<void> ShardLink::push(VariableId variable, Step step, ElementRange range, DType dtype,
                                  std::span<const std::byte> gradient) {
  if (session() == nullptr) return not_connected();
  auto request = session()->pushRequest();
  request.setVariable(variable.value);
  request.setStep(step);
  request.setOffset(range.begin);
  request.setDtype(to_wire(dtype));
  capnp::Data::Reader data(reinterpret_cast<const kj::byte*>(gradient.data()), gradient.size());
  // Zero copy: the trainer's memory becomes a segment of the message. Cap'n Proto needs it
  // word-aligned and whole words (it writes up to the next word boundary); otherwise copy.
  if (reinterpret_cast<uintptr_t>(gradient.data()) % sizeof(capnp::word) == 0 &&
      gradient.size() % sizeof(capnp::word) == 0) {
    auto orphanage =
        capnp::Orphanage::getForMessageContaining(wire::Session::PushParams::Builder(request));
    request.adoptData(orphanage.referenceExternalData(data));
  } else {
    request.setData(data);
  }
  return request.send().ignoreResult();
}

kj::Promise<int64_t> ShardLink::poll(VariableId variable, Step step, ElementRange range,
                                     std::byte* out, size_t out_bytes) {
  if (session() == nullptr) return not_connected();
  auto request = session()->pollRequest();
  request.setVariable(variable.value);
  request.setStep(step);
  request.setOffset(range.begin);
  request.setCount(range.size());
  return request.send().then([out, out_bytes](capnp::Response<wire::Session::PollResults> r) {
    copy_value(r.getValue(), out, out_bytes);
    return r.getAppliedAtNs();
  });
}

kj::Promise<std::vector<std::exception_ptr>> ShardLink::push_fused(
    std::span<const FusedPartition> parts) {
  if (session() == nullptr) return not_connected();
  auto request = session()->pushFusedRequest();
  auto list = request.initPartitions(static_cast<unsigned>(parts.size()));
  for (unsigned i = 0; i < parts.size(); ++i) {
    const FusedPartition& p = parts[i];
    list[i].setVariable(p.variable.value);
    list[i].setStep(p.step);
    list[i].setOffset(p.range.begin);
    list[i].setDtype(to_wire(p.dtype));
    list[i].setData(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(p.gradient.data()),
                                        p.gradient.size()));
  }
  size_t count = parts.size();
  return request.send().then([count](capnp::Response<wire::Session::PushFusedResults> r) {
    auto errors = r.getErrors();
    if (errors.size() != count)
      fail(ErrorCode::internal, "shard answered {} outcomes to a fused push of {}", errors.size(),
           count);
    std::vector<std::exception_ptr> out;
    for (auto text : errors) out.push_back(error_of(text));
    return out;
  });
}

kj::Promise<std::vector<PollOutcome>> ShardLink::poll_fused(std::span<const FusedPartition> parts) {
  if (session() == nullptr) return not_connected();
  auto request = session()->pollFusedRequest();
  auto list = request.initRanges(static_cast<unsigned>(parts.size()));
  std::vector<std::pair<std::byte*, size_t>> outs;
  for (unsigned i = 0; i < parts.size(); ++i) {
    const FusedPartition& p = parts[i];
    list[i].setVariable(p.variable.value);
    list[i].setStep(p.step);
    list[i].setOffset(p.range.begin);
    list[i].setCount(p.range.size());
    outs.emplace_back(p.out, p.range.size() * element_bytes(p.dtype));
  }
  return request.send().then(
      [outs = std::move(outs)](capnp::Response<wire::Session::PollFusedResults> r) {
        auto values = r.getValues();
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
      });
}

kj::Promise<void> ShardLink::pull(VariableId variable, ElementRange range, std::byte* out,
                                  size_t out_bytes) {
  if (session() == nullptr) return not_connected();
  auto request = session()->pullRequest();
  request.setVariable(variable.value);
  request.setOffset(range.begin);
  request.setCount(range.size());
  return request.send().then([out, out_bytes](capnp::Response<wire::Session::PullResults> r) {
    copy_value(r.getValue(), out, out_bytes);
  });
}

}  // namespace psched
