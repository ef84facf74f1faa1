// SPDX-License-Identifier: Apache-2.0
// The fuzzer's committed corpus, replayed through its entry point in the normal build, and
// the seeds checked to reach the handlers (not stop at a framing error).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "tests/fuzz/fuzz_shard.h"

using namespace psched;

namespace {

const std::filesystem::path kCorpus = PSCHED_FUZZ_CORPUS;

std::vector<uint8_t> read_input(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The shard's counters after it was fed `seed`.
ShardStats fed(const std::string& seed) {
  std::vector<uint8_t> input = read_input(kCorpus / seed);
  REQUIRE(!input.empty());
  fuzz::FuzzShard shard(fuzz::input_mode(input));
  shard.feed(std::span(input).subspan(1));
  return shard.stats();
}

}  // namespace

TEST_CASE("every input of the committed fuzz corpus runs through a shard") {
  size_t inputs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kCorpus)) {
    CAPTURE(entry.path().filename().string());
    std::vector<uint8_t> input = read_input(entry.path());
    CHECK_NOTHROW(fuzz::run_input(input));
    ++inputs;
  }
  CHECK(inputs > 0);
}

TEST_CASE("the recorded push-poll-pull seed registers, applies and answers") {
  ShardStats stats = fed("seed-push-poll-pull");
  CHECK(stats.variables == 1);
  CHECK(stats.partitions_applied == 2);
  CHECK(stats.bytes_sent == 64 + 32);
}

TEST_CASE("the recorded fused seed applies both partitions of one message") {
  ShardStats stats = fed("seed-fused");
  CHECK(stats.variables == 2);
  CHECK(stats.partitions_applied == 2);
}

TEST_CASE("the recorded refusals seed is refused request by request") {
  ShardStats stats = fed("seed-refusals");
  CHECK(stats.variables == 1);
  CHECK(stats.partitions_applied == 0);
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::invalid_argument)] == 1);
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::spec_conflict)] == 1);
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::unknown_variable)] == 1);
}

TEST_CASE("the recorded waiting-polls seed is refused past the waiting poll limit") {
  ShardStats stats = fed("seed-waiting-polls");
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::overloaded)] == 1);
}

TEST_CASE("the recorded pipelined seed is answered call by call") {
  ShardStats stats = fed("seed-pipelined");
  CHECK(stats.variables == 1);
  CHECK(stats.partitions_applied == 1);
  CHECK(stats.bytes_sent == 64 + 64);
}

TEST_CASE("calls whose connection closed before the shard ran them still run to the end") {
  std::vector<uint8_t> input = read_input(kCorpus / "seed-pipelined-eager");
  REQUIRE(fuzz::input_eager(input));
  fuzz::FuzzShard shard(Mode::async);
  shard.feed(std::span(input).subspan(1), true);
  ShardStats stats = shard.stats();
  CHECK(stats.variables == 1);
  CHECK(stats.partitions_applied == 1);
  CHECK(stats.bytes_sent == 64 + 64);
}
