#include "net/shard_service.h"

#include <memory>

#include "net/cross_thread_promise.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

struct ValueResult {
  PooledBuffer value;
  Step step = 0;
};

// A ValueReply that fulfils `f` (on the shard's strand; the promise resolves on the KJ thread).
VariableShard::ValueReply value_reply(SharedFulfiller<ValueResult> f) {
  return [f](std::exception_ptr error, PooledBuffer value, Step step) {
    if (error) return (*f)->reject(to_kj_exception(error));
    (*f)->fulfill(ValueResult{std::move(value), step});
  };
}

template <typename Results>
void set_value(Results results, const ValueResult& r) {
  // TODO(perf): one copy here; the shard could write straight into the result buffer.
  results.setValue(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(r.value.data()), r.value.size()));
  results.setAppliedStep(r.step);
}

// The exception that answers a request the service refused before it reached the shard,
// which counts it for the operator view.
kj::Exception refuse(ShardEndpoint& endpoint, std::exception_ptr error) {
  endpoint.shard.report_error(error);
  return to_kj_exception(error);
}

}  // namespace

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

kj::Promise<void> ShardService::connect(ConnectContext context) {
  auto params = context.getParams();
  const DeploymentConfig& config = endpoint_.config;
  auto token = params.getToken();
  if (!config.auth_token.empty() &&
      !constant_time_equal(std::string_view(token.cStr(), token.size()), config.auth_token))
    return refuse(
        endpoint_,
        std::make_exception_ptr(Error(
            ErrorCode::bad_token,
            fmt::format("connect to shard {} rejected: wrong auth token", endpoint_.id.value))));
  if (params.getWorkerId() >= config.workers)
    return refuse(
        endpoint_,
        std::make_exception_ptr(
            Error(ErrorCode::invalid_argument,
                  fmt::format("connect rejected: worker id {} is not below the job's {} workers",
                              params.getWorkerId(), config.workers))));

  auto results = context.getResults();
  results.setSession(kj::heap<SessionService>(endpoint_, WorkerId(params.getWorkerId())));
  auto layout = results.initLayout();
  layout.setShardIndex(endpoint_.id.value);
  auto addresses = layout.initShardAddresses(static_cast<unsigned>(config.shards.size()));
  for (unsigned i = 0; i < config.shards.size(); ++i)
    addresses.set(i, config.shards[i].listen.to_string());
  layout.setSplitBytes(config.split_bytes);
  layout.setMode(to_wire(config.mode));
  layout.setWorkers(config.workers);
  layout.setMaxMessageBytes(config.limits.max_message_bytes);
  to_wire(config.optimizer, layout.initDefaultOptimizer());
  return kj::READY_NOW;
}

ElementRange SessionService::range(const char* what, uint64_t offset, uint64_t count) const {
  if (offset > UINT64_MAX - count)
    fail(ErrorCode::offset_out_of_range, "{} rejected: offset {} + count {} overflows", what,
         offset, count);
  return {offset, offset + count};
}

kj::Promise<void> SessionService::register_(RegisterContext context) {
  auto params = context.getParams();
  VariableSpec spec;
  try {
    spec = from_wire(params.getSpec(), endpoint_.config.optimizer,
                     endpoint_.config.limits.max_name_bytes);
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
  auto initial = params.getInitialValue();
  auto [promise, f] = cross_thread_promise<std::pair<VariableId, bool>>();
  endpoint_.shard.register_variable(
      kj::mv(spec), {params.getBegin(), params.getEnd()},
      {reinterpret_cast<const std::byte*>(initial.begin()), initial.size()},
      [f](std::exception_ptr error, VariableId id, bool created) {
        if (error) return (*f)->reject(to_kj_exception(error));
        (*f)->fulfill(std::make_pair(id, created));
      });
  return promise.then([context](std::pair<VariableId, bool> r) mutable {
    context.getResults().setVariable(r.first.value);
    context.getResults().setCreated(r.second);
  });
}

kj::Promise<void> SessionService::push(PushContext context) {
  auto params = context.getParams();
  auto data = params.getData();
  uint64_t limit = endpoint_.config.limits.max_message_bytes;
  try {
    if (data.size() > limit)
      fail(ErrorCode::message_too_large,
           "push to variable id {} rejected: {} bytes of data exceed the message limit of {} "
           "bytes",
           params.getVariable(), data.size(), limit);
    DType dtype = from_wire(params.getDtype());
    if (data.size() % element_bytes(dtype) != 0)
      fail(ErrorCode::shape_mismatch,
           "push to variable id {} rejected: {} bytes of data are not whole {} elements",
           params.getVariable(), data.size(), to_string(dtype));
    ElementRange r = range("push", params.getOffset(), data.size() / element_bytes(dtype));
    auto [promise, f] = cross_thread_promise<void>();
    endpoint_.shard.push(worker_, VariableId(params.getVariable()), params.getStep(), r, dtype,
                         {reinterpret_cast<const std::byte*>(data.begin()), data.size()},
                         [f](std::exception_ptr error) {
                           if (error) return (*f)->reject(to_kj_exception(error));
                           (*f)->fulfill();
                         });
    return kj::mv(promise);
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
}

kj::Promise<void> SessionService::poll(PollContext context) {
  auto params = context.getParams();
  try {
    ElementRange r = range("poll", params.getOffset(), params.getCount());
    auto [promise, f] = cross_thread_promise<ValueResult>();
    PollTicket ticket(endpoint_.next_poll_ticket++);
    endpoint_.shard.poll(worker_, VariableId(params.getVariable()), params.getStep(), r, ticket,
                         value_reply(f));
    // A poll may wait long; when its caller goes away (cancel, dropped connection) the promise
    // is dropped and the shard forgets the poll. Polls borrow nothing from their parameters.
    context.allowCancellation();
    VariableShard& shard = endpoint_.shard;
    std::weak_ptr<bool> alive = endpoint_.alive;
    return promise.then([context](ValueResult r) mutable { set_value(context.getResults(), r); })
        .attach(kj::defer([&shard, alive, ticket] {
          if (alive.lock()) shard.withdraw_poll(ticket);
        }));
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
}

kj::Promise<void> SessionService::pull(PullContext context) {
  auto params = context.getParams();
  try {
    ElementRange r = range("pull", params.getOffset(), params.getCount());
    auto [promise, f] = cross_thread_promise<ValueResult>();
    endpoint_.shard.pull(VariableId(params.getVariable()), r, value_reply(f));
    return promise.then([context](ValueResult r) mutable { set_value(context.getResults(), r); });
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
}

}  // namespace psched
