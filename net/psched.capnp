# SPDX-License-Identifier: Apache-2.0
# The psched wire protocol. This file is the contract between workers and shards.
#
# A worker connects to every shard it uses (Shard.connect), gets a Session capability and the
# cluster layout, registers its variables on the shards the layout places them on, then pushes
# gradient partitions and polls for the fresh values. Offsets and counts are in elements of the
# variable's dtype and absolute within the whole variable (not the shard's part of it).
#
# Errors come back as Cap'n Proto exceptions whose description starts with "[code] ", code
# being a psched::ErrorCode name (common/error.h), e.g. "[unknown_variable] push to variable
# id 7 rejected: no such variable on shard 1".

@0xb1a3f4c9d7e28a61;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("psched::wire");

enum DType {
  float32 @0;
  float64 @1;
}

enum WireFormat {  # how a gradient or a value travels (compression/codec.h gives the bytes)
  none @0;    # the variable's dtype, as it is
  bf16 @1;    # bfloat16, rounded to nearest even
  fp16 @2;    # IEEE binary16, rounded to nearest even
  topk @3;    # pushes: the largest magnitudes of the partition, as indices and values;
              # values: a delta (the elements that changed most, as indices and new values)
  onebit @4;  # pushes only: the partition's signs and its mean magnitude
}

enum Mode {
  async @0;  # each push applied on arrival
  sync @1;   # the mean of all workers' step-s gradients applied once
  bounded @2;  # applied as async; a poll for step s waits until every member pushed s - staleness
}

struct OptimizerSpec {
  kind @0 :Text;  # sgd, momentum, adam, adam_tf, adamw, adagrad, rmsprop
  lr @1 :Float64;
  momentum @2 :Float64;
  dampening @3 :Float64;
  nesterov @4 :Bool;
  beta1 @5 :Float64;
  beta2 @6 :Float64;
  eps @7 :Float64;
  weightDecay @8 :Float64;
  amsgrad @9 :Bool;
  lrDecay @10 :Float64;
  initialAccumulatorValue @11 :Float64;
  alpha @12 :Float64;
  centered @13 :Bool;
}

struct VariableSpec {
  name @0 :Text;
  shape @1 :List(UInt64);
  dtype @2 :DType;
  priority @3 :Int64;  # lower is more urgent; clients default to registration order
  optimizer @4 :OptimizerSpec;
  useServerOptimizer @5 :Bool;  # true: ignore `optimizer`, use the deployment's default
}

struct RowInit {  # how a table's rows start (actors/shard/table_spec.h)
  kind @0 :Text;  # zeros, uniform (on [a, b)), normal (mean a, standard deviation b)
  a @1 :Float64;
  b @2 :Float64;
}

struct TableSpec {  # an embedding table, held row by row on every shard
  name @0 :Text;
  numEmbeddings @1 :UInt64;  # ids run from 0 to numEmbeddings - 1
  dim @2 :UInt32;            # elements per row
  dtype @3 :DType;
  priority @4 :Int64;
  optimizer @5 :OptimizerSpec;  # kind: sgd, adagrad, rowwise_adagrad, sparse_adam
  init @6 :RowInit;
  seed @7 :UInt64;
  maxRows @8 :UInt64;     # rows stored a shard, least recently updated evicted (0: no bound)
  admitAfter @9 :UInt32;  # a row is stored from its admitAfter-th update (0, 1: its first)
}

struct ClusterLayout {
  shardIndex @0 :UInt32;              # the shard that answered
  shardAddresses @1 :List(Text);      # every shard, in config order ("host:port")
  splitBytes @2 :UInt64;              # placement threshold (common/placement.h)
  mode @3 :Mode;
  workers @4 :UInt32;
  maxMessageBytes @5 :UInt64;
  defaultOptimizer @6 :OptimizerSpec;
  job @7 :UInt64;                     # the job's identity (actors/durability/shard_durability.h)
  slotEpoch @8 :UInt64;               # the job's slot map (common/slot_map.h): its epoch
  slotOwners @9 :List(UInt16);        # and each slot's shard, by slot
}

interface Shard {
  connect @0 (workerId :UInt32, token :Text) -> (session :Session, layout :ClusterLayout);
  # Fails with [bad_token] when the token is wrong, [invalid_argument] when workerId is not
  # below the deployment's worker count.
}

interface Session {
  register @0 (spec :VariableSpec, begin :UInt64, end :UInt64, initialValue :Data)
      -> (variable :UInt32, created :Bool);
  # Registers this shard's part [begin, end) of a variable, placed by the layout. The same spec
  # again is a no-op (created = false, the value stays); a different spec for the name fails
  # with [spec_conflict]. initialValue holds (end - begin) elements.

  push @1 (variable :UInt32, step :UInt64, offset :UInt64, dtype :DType, data :Data,
           format :WireFormat) -> ();
  # One partition of this worker's gradient for `step`, `data` in `format`. The reply is the
  # receipt: the partition was validated and applied (async) or accumulated (sync). The shard
  # decodes a compressed partition into `dtype` first; one that does not decode, or decodes to
  # an infinity or a NaN, is refused ([invalid_argument]) and changes nothing.

  poll @2 (variable :UInt32, step :UInt64, offset :UInt64, count :UInt64,
           valueFormat :WireFormat, baseVersion :UInt64, deltaCount :UInt32, deltaRing :UInt16,
           deltaRefresh :Bool)
      -> (value :Data, appliedStep :UInt64, appliedAtNs :Int64, delta :Bool,
          version :UInt64);
  # The fresh value of [offset, offset+count) once `step`'s update of that range is applied:
  # this worker's own update in async mode, the aggregate of all workers in sync mode.
  # appliedStep: that step; `value` is the range as the answer leaves, so it may also hold
  # updates applied after it (never less than appliedStep's).
  # appliedAtNs: the shard's wall clock (ns since the Unix epoch) when it found the range
  # applied for this poll (for traces; only comparable across machines with synced clocks).
  # valueFormat: none, bf16 or fp16; `value` is the range in it (the shard keeps its own
  # values and optimizer state at full width).
  # Delta polls (deltaCount > 0; actors/shard/value_deltas.h): the worker holds version
  # baseVersion of the range (0: none) and asks for what changed since, at most deltaCount
  # elements a new delta, the shard keeping the newest deltaRing; deltaRefresh asks the shard to
  # publish the range's values whole (the first such poll of a version does), and to answer with
  # them. The answer's `delta` is true when `value` is a delta (a topk body,
  # compression/codec.h: encode_delta; indices and new values), else `value` is the range whole
  # in valueFormat; `version` is what the worker holds once it has applied it. Other polls are
  # answered in valueFormat, delta false, version 0 (as a shard before delta pulls answers).

  pull @3 (variable :UInt32, offset :UInt64, count :UInt64) -> (value :Data, appliedStep :UInt64);
  # The current value of the range, at once.

  pushPoll @4 (variable :UInt32, step :UInt64, offset :UInt64, dtype :DType, data :Data,
               format :WireFormat, valueFormat :WireFormat, baseVersion :UInt64,
               deltaCount :UInt32, deltaRing :UInt16, deltaRefresh :Bool)
      -> (value :Data, appliedStep :UInt64, appliedAtNs :Int64, delta :Bool,
          version :UInt64);
  # push, then poll of the same range, in one call: async mode's whole round trip in half the
  # messages. A refused push rejects the call with the push's error (the variable untouched);
  # else it is answered as poll. A worker that must know of the receipt before the value (sync
  # mode frees credit on receipt) sends push and poll instead.

  openDataStream @5 () -> (key :Data);
  # A key for opening this worker's data stream (below): a second connection to the shard that
  # carries push, poll and pushPoll as frames, without per-call RPC objects. The key opens one
  # stream; asking again replaces an unused one.

  join @6 (atLeast :UInt64) -> (step :UInt64);
  # This worker is a process that starts: the step from which it takes part. Sync and bounded
  # modes: at least atLeast; a declared worker that has not pushed keeps its step (1 in a fresh
  # job), any other (a restarted process, one whose lease ended) becomes a member from a step
  # that no variable of this shard has begun (sync), or level with the slowest member
  # (bounded). A worker asks every shard and, while their answers differ, asks again with the
  # largest. Async mode: the first step some variable here has not completed for it, 0 when the
  # shard hosts none (atLeast unused; a worker takes the smallest answer other than 0).

  registerTable @7 (spec :TableSpec) -> (table :UInt32, created :Bool);
  # Registers an embedding table: this shard holds the rows whose ids the placement gives it (a
  # 64-bit mix of the table's name and the id; common/placement.h). Ids share one space with
  # variables. The same spec again is a no-op; another for the name fails with [spec_conflict].

  pushRows @8 (table :UInt32, step :UInt64, ids :Data, dtype :DType, data :Data,
                format :WireFormat) -> ();
  # This worker's step `step` of the table's rows held here: `ids` (little-endian UInt64, each
  # once) and one gradient row each in `data` (none, bf16 or fp16). Every worker pushes every
  # step of every table to every shard, with no ids where it touched none, or sync steps never
  # close. Sync: a row gets the mean over the members (a member that pushed without it counts
  # as zero). All or nothing: an id out of range, a row of the wrong width refuse the call.

  pullRows @9 (table :UInt32, step :UInt64, ids :Data, valueFormat :WireFormat)
      -> (value :Data, appliedStep :UInt64);
  # The rows `ids` (little-endian UInt64), one after another in `valueFormat`, once `step`'s
  # update of them is applied (as poll; step 0: at once, the current rows).
}

# The data stream. A worker opens it beside its RPC connection with a key from
# Session.openDataStream, and sends its pushes and polls over it as frames: a fixed header and
# raw bytes, no per-call RPC objects (net/data_frame.h reads and writes them). Registration,
# pulls and the operator view stay on RPC.
#
# It starts with the worker's preface, dataPreface then the key's dataKeyBytes. The shard answers
# with a `ready` answer, or an `error` answer and closes. Then each side sends frames: a header
# of frameHeaderBytes and `bodyBytes` after it. Integers are little-endian, at these byte offsets:
#
#   request (worker -> shard)            answer (shard -> worker)
#   0   UInt8   RequestKind              0   UInt8   AnswerKind
#   1   UInt8   DType                    1   UInt8   WireFormat of the body (value)
#   2   UInt8   WireFormat of the body   8   UInt64  id of the request answered
#   3   UInt8   WireFormat of the value
#   4   UInt32  variable                 16  UInt64  appliedStep (value)
#   8   UInt64  id, the worker's choice  24  Int64   appliedAtNs (value)
#   16  UInt64  step                     32  UInt64  bodyBytes
#   24  UInt64  offset (elements); pushRows, pullRows: how many ids start the body
#   32  UInt64  bodyBytes (push, pushPoll, pushRows, pullRows) or count (poll: elements)
#   40  UInt64  baseVersion (poll, pushPoll) 40  UInt64  version (value)
#   48  UInt32  deltaCount (poll, pushPoll)
#   52  UInt16  deltaRing (poll, pushPoll)
#   54  UInt8   1: deltaRefresh (poll, pushPoll)
#
# Other bytes are zero. Fields mean what Session's parameters of the same names do (the body's
# WireFormat is push's `format`, the value's poll's `valueFormat`; a value answer's body is in
# the format byte 1 names: its request's valueFormat, or topk for a delta).

const dataPreface :Text = "PSCHDAT2";
const dataKeyBytes :UInt32 = 16;
const frameHeaderBytes :UInt32 = 56;

enum RequestKind {
  unknown @0;
  push @1;      # body: the gradient; answered by a receipt (or an error)
  poll @2;      # no body; answered by the value (or an error)
  pushPoll @3;  # body: the gradient; push, then poll of its range: answered by the value only
  cancel @4;    # no body; forgets the waiting poll or pushPoll `id` (no answer)
  pushRows @5;  # body: the ids (8 bytes each), then their gradient rows; answered by a receipt
  pullRows @6;  # body: the ids; answered by the rows (value), once `step` is applied to them
}

enum AnswerKind {
  unknown @0;
  receipt @1;  # no body
  value @2;    # body: the range's bytes
  error @3;    # body: "[code] message", as an RPC exception's description
  ready @4;    # the preface's answer: the stream is open
}
