// SPDX-License-Identifier: Apache-2.0
// psched-fuzz-seeds DIR: writes the fuzzer's seed inputs to DIR, one file per scenario. Each is
// the options byte (fuzz_shard.h) and the bytes a real ShardLink client sent to a FuzzShard while
// running the scenario (connect, register, push, poll, pull, and requests that fail).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "link/shard_link.h"
#include "tests/fuzz/fuzz_shard.h"

using namespace psched;

namespace {

// A stream that passes everything through and keeps a copy of what is written to it.
class RecordingStream final : public kj::AsyncIoStream {
 public:
  RecordingStream(kj::Own<kj::AsyncIoStream> inner, std::string& sent)
      : inner_(kj::mv(inner)), sent_(sent) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    return inner_->tryRead(buffer, min, max);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    sent_.append(static_cast<const char*>(buffer), size);
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    for (auto piece : pieces)
      sent_.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
  std::string& sent_;
};

std::span<const std::byte> bytes(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}
std::byte* out(std::vector<float>& v) {
  return reinterpret_cast<std::byte*>(v.data());
}

VariableSpec spec(std::string name, std::vector<uint64_t> shape) {
  VariableSpec s{std::move(name), std::move(shape), DType::float32, Priority(0), {}};
  s.optimizer.kind = optim::OptimizerKind::adam;
  s.optimizer.lr = 0.01;
  return s;
}

// What a scenario gets: the shard and a connected client link to it.
struct Client {
  fuzz::FuzzShard& shard;
  ShardLink& link;
  VariableId add(const std::string& name, uint64_t elements) {
    std::vector<float> initial(elements, 1.f);
    return shard.run(
        link.register_part(spec(name, {elements}), false, {0, elements}, bytes(initial)));
  }
  // Runs `call`, which is expected to fail.
  template <typename T>
  void refused(kj::Promise<T> call) {
    (void)kj::runCatchingExceptions([&] { shard.run(kj::mv(call)); });
  }
};

void push_poll_pull(Client c) {
  VariableId w = c.add("fc/w", 16);
  std::vector<float> grad(16, 0.5f), fresh(16);
  c.shard.run(
      c.link.push(w, Step(1), {0, 8}, DType::float32, bytes({grad.begin(), grad.begin() + 8})));
  c.shard.run(
      c.link.push(w, Step(1), {8, 16}, DType::float32, bytes({grad.begin(), grad.begin() + 8})));
  c.shard.run(c.link.poll(w, Step(1), {0, 16}, out(fresh), 64));
  c.shard.run(c.link.pull(w, {4, 12}, out(fresh), 32));
}

// Every call sent before any answer arrives (the variable's id, 0, is known in advance).
void pipelined(Client c) {
  std::vector<float> initial(16, 1.f), grad(16, 0.5f), fresh(16), value(16);
  auto registered = c.link.register_part(spec("fc/w", {16}), false, {0, 16}, bytes(initial));
  auto pushed = c.link.push(VariableId(0), Step(1), {0, 16}, DType::float32, bytes(grad));
  auto polled = c.link.poll(VariableId(0), Step(1), {0, 16}, out(fresh), 64);
  auto pulled = c.link.pull(VariableId(0), {0, 16}, out(value), 64);
  c.shard.run(kj::mv(registered));
  c.shard.run(kj::mv(pushed));
  c.shard.run(kj::mv(polled));
  c.shard.run(kj::mv(pulled));
}

void push_pull(Client c) {
  VariableId w = c.add("fc/w", 16);
  std::vector<float> grad(16, 0.5f), value(16);
  c.shard.run(c.link.push(w, Step(1), {0, 16}, DType::float32, bytes(grad)));
  c.shard.run(c.link.pull(w, {0, 16}, out(value), 64));
}

void refusals(Client c) {
  VariableId w = c.add("w", 4);
  std::vector<float> grad(4, 1.f), fresh(4), big(8, 1.f);
  c.refused(c.link.register_part(spec("x", {1ull << 40, 1ull << 40}), false, {0, 4}, bytes(grad)));
  c.refused(c.link.register_part(spec("w", {5}), false, {0, 4}, bytes(grad)));
  c.refused(c.link.push(VariableId(7), Step(1), {0, 4}, DType::float32, bytes(grad)));
  c.refused(c.link.push(w, Step(3), {0, 4}, DType::float32, bytes(grad)));
  c.refused(c.link.push(w, Step(1), {2, 10}, DType::float32, bytes(big)));
  c.refused(c.link.poll(w, Step(5), {0, 4}, out(fresh), 16));
  c.refused(c.link.pull(w, {3, 9}, out(big), 24));
}

// A poll that waits (sync mode: the other worker never pushes) and one over the limit.
void waiting_polls(Client c) {
  VariableId w = c.add("w", 4);
  std::vector<float> grad(4, 1.f);
  std::vector<std::vector<float>> fresh(17, std::vector<float>(4));
  c.shard.run(c.link.push(w, Step(1), {0, 4}, DType::float32, bytes(grad)));
  std::vector<kj::Promise<int64_t>> polls;
  for (auto& f : fresh) polls.push_back(c.link.poll(w, Step(1), {0, 4}, out(f), 16));
  c.shard.settle();
}

// The options byte of a fuzz input (fuzz_shard.h).
constexpr char kAsync = 0, kSync = 1, kEager = 2;

void write_seed(const std::filesystem::path& dir, const std::string& name, char options,
                const std::function<void(Client)>& scenario) {
  std::string sent(1, options);
  Mode mode = options & kSync ? Mode::sync : Mode::async;
  {
    fuzz::FuzzShard shard(mode);
    ShardLink link(kj::heap<RecordingStream>(shard.connect(), sent), 1 << 20);
    shard.run(link.connect(WorkerId(0), "fuzz"));
    scenario(Client{shard, link});
  }
  std::ofstream(dir / ("seed-" + name), std::ios::binary) << sent;
  std::printf("%s: %zu bytes\n", name.c_str(), sent.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: psched-fuzz-seeds DIR\n");
    return 2;
  }
  std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  write_seed(dir, "push-poll-pull", kAsync, push_poll_pull);
  write_seed(dir, "pipelined", kAsync, pipelined);
  write_seed(dir, "pipelined-eager", kAsync | kEager, pipelined);
  write_seed(dir, "push-pull-sync", kSync, push_pull);
  write_seed(dir, "refusals", kAsync, refusals);
  write_seed(dir, "waiting-polls", kSync, waiting_polls);
  return 0;
}
