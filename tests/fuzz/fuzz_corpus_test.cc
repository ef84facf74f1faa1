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

// The shard's counters after it was fed the data stream seed `seed`.
ShardStats fed_data(const std::string& seed) {
  std::vector<uint8_t> input = read_input(kCorpus / seed);
  REQUIRE(fuzz::input_data_stream(input));
  fuzz::FuzzShard shard(fuzz::input_mode(input));
  shard.feed_data(std::span(input).subspan(1));
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

TEST_CASE("the data stream push-poll seed applies and answers frame by frame") {
  ShardStats stats = fed_data("seed-data-push-poll");
  CHECK(stats.partitions_applied == 3);
  // The poll's and the two pushPolls' values: float32 twice, float64 once.
  CHECK(stats.bytes_sent == 2 * 4 * fuzz::kDataFloatElements + 8 * fuzz::kDataDoubleElements);
}

TEST_CASE("the data stream cancel seed withdraws its waiting poll") {
  ShardStats stats = fed_data("seed-data-cancel");
  CHECK(stats.polls_waiting == 0);
  CHECK(stats.bytes_sent == 0);
  CHECK(stats.bytes_received == 4 * fuzz::kDataFloatElements);
}

TEST_CASE("the data stream refusals seed is refused frame by frame, then closed") {
  ShardStats stats = fed_data("seed-data-refusals");
  CHECK(stats.partitions_applied == 0);
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::shape_mismatch)] == 1);
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::unknown_variable)] == 1);
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::offset_out_of_range)] == 1);
  // The reused waiting id, and the frame of unknown kind that closed the stream.
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::invalid_argument)] == 2);
  CHECK(stats.polls_waiting == 0);
}
