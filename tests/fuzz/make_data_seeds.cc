// SPDX-License-Identifier: Apache-2.0
// psched-fuzz-data-seeds DIR: writes the fuzz corpus's data stream seeds (seed-data-*): frames
// a worker sends on its data stream (net/data_frame.h), to the variables FuzzShard registers
// for them (fuzz_shard.h). Built with -DPSCHED_FUZZ=ON, beside psched-fuzz-seeds.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "net/data_frame.h"
#include "tests/fuzz/fuzz_shard.h"

using namespace psched;

namespace {

constexpr char kAsync = 4, kSync = 5;  // the data stream bit, and sync mode's

// One frame: `request`'s header and a body of `body_bytes` (a gradient of 0.5s, as bytes).
std::string frame(const RequestHeader& request, size_t body_bytes = 0) {
  FrameHeaderBytes header = encode(request);
  std::string out(reinterpret_cast<const char*>(header.data()), header.size());
  std::vector<float> half(body_bytes / 4 + 1, 0.5f);
  out.append(reinterpret_cast<const char*>(half.data()), body_bytes);
  return out;
}

RequestHeader floats(wire::RequestKind kind, uint64_t id, uint64_t step, uint64_t offset,
                     uint64_t size) {
  RequestHeader request{kind, DType::float32, 0, id, step, offset};
  (kind == wire::RequestKind::POLL ? request.count : request.body_bytes) = size;
  return request;
}

void write_seed(const std::filesystem::path& dir, const std::string& name, char options,
                const std::string& frames) {
  std::ofstream(dir / ("seed-data-" + name), std::ios::binary) << options << frames;
  std::printf("data-%s: %zu bytes\n", name.c_str(), frames.size() + 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: psched-fuzz-data-seeds DIR\n");
    return 2;
  }
  std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const uint64_t f32 = fuzz::kDataFloatElements, f64 = fuzz::kDataDoubleElements;
  // A push, a poll of its range, and a pushPoll of each variable: everything applied.
  write_seed(
      dir, "push-poll", kAsync,
      frame(floats(wire::RequestKind::PUSH, 1, 1, 0, 4 * f32), 4 * f32) +
          frame(floats(wire::RequestKind::POLL, 2, 1, 0, f32)) +
          frame(floats(wire::RequestKind::PUSH_POLL, 3, 2, 0, 4 * f32), 4 * f32) +
          frame({wire::RequestKind::PUSH_POLL, DType::float64, 1, 4, 1, 0, 8 * f64}, 8 * f64));
  // A poll that waits, is cancelled, and a push of the step it waited for.
  write_seed(dir, "cancel", kSync,
             frame(floats(wire::RequestKind::POLL, 1, 1, 0, f32)) +
                 frame(floats(wire::RequestKind::CANCEL, 1, 0, 0, 0)) +
                 frame(floats(wire::RequestKind::PUSH, 2, 1, 0, 4 * f32), 4 * f32));
  // Refused one by one, the stream going on: bytes not whole elements, an unknown variable, a
  // range past the end, a reused waiting id; then a frame of unknown kind closes it.
  write_seed(dir, "refusals", kAsync,
             frame(floats(wire::RequestKind::PUSH, 1, 1, 0, 6), 6) +
                 frame({wire::RequestKind::PUSH, DType::float32, 9, 2, 1, 0, 16}, 16) +
                 frame(floats(wire::RequestKind::PUSH, 3, 1, f32 - 2, 16), 16) +
                 frame(floats(wire::RequestKind::POLL, 4, 1, 0, 4)) +
                 frame(floats(wire::RequestKind::POLL, 4, 1, 0, 4)) +
                 frame({static_cast<wire::RequestKind>(9), DType::float32, 0, 5, 1, 0, 0}));
  return 0;
}
