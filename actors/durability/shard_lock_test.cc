// SPDX-License-Identifier: Apache-2.0
// A shard's claim on its directory: one holder at a time, named to whoever is refused, and
// dropped with the holder, a SIGKILLed one included.
#include "actors/durability/shard_lock.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <optional>
#include <string>

#include <doctest/doctest.h>

#include "actors/durability/temp_dir.h"

using namespace psched;

TEST_CASE("a shard's lock has one holder at a time and names it to the refused") {
  testing::TempDir dir;
  std::optional<ShardLock> first = ShardLock::try_take(dir.path, ShardId(3));
  REQUIRE(first);
  CHECK(first->file() == dir.path / "shard-3.lock");
  std::string holder;
  CHECK_FALSE(ShardLock::try_take(dir.path, ShardId(3), &holder));
  CHECK(holder.find(fmt::format("pid {} on ", getpid())) == 0);
  CHECK(ShardLock::try_take(dir.path, ShardId(4)));  // another shard's is its own
  first.reset();
  CHECK(ShardLock::try_take(dir.path, ShardId(3)));
}

TEST_CASE("a SIGKILLed holder leaves its shard free") {
  testing::TempDir dir;
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto lock = ShardLock::try_take(dir.path, ShardId(0));
    char done = lock ? '1' : '0';
    [[maybe_unused]] auto n = write(ready[1], &done, 1);
    pause();
    _exit(0);
  }
  char done = 0;
  REQUIRE(read(ready[0], &done, 1) == 1);
  REQUIRE(done == '1');
  std::string holder;
  CHECK_FALSE(ShardLock::try_take(dir.path, ShardId(0), &holder));
  CHECK(holder.find(fmt::format("pid {} on ", child)) == 0);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(ShardLock::try_take(dir.path, ShardId(0)));
  close(ready[0]);
  close(ready[1]);
}
