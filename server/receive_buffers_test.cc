// SPDX-License-Identifier: Apache-2.0
#include "server/receive_buffers.h"

#include <doctest/doctest.h>

using namespace psched;

namespace {

constexpr size_t kLarge = ReceiveBuffers::kPooledFrom;

}  // namespace

TEST_CASE("a large receive buffer dropped goes back to the pool and serves the next push") {
  auto pool = ReceiveBuffers::make(4 * kLarge);
  auto first = pool->take(kLarge + 64);
  const std::byte* memory = first->data();
  CHECK(first->size() == kLarge + 64);
  CHECK(pool->kept_bytes() == 0);
  first.reset();
  CHECK(pool->kept_bytes() == kLarge + 64);

  auto second = pool->take(kLarge);  // smaller, within twice: the same memory
  CHECK(second->data() == memory);
  CHECK(second->size() == kLarge);
  CHECK(pool->kept_bytes() == 0);
  second.reset();
  CHECK(pool->kept_bytes() == kLarge + 64);  // its whole capacity
}

TEST_CASE("a kept buffer serves no request larger than it, nor one under half its size") {
  auto pool = ReceiveBuffers::make(8 * kLarge);
  pool->take(3 * kLarge).reset();
  CHECK(pool->kept_bytes() == 3 * kLarge);
  auto larger = pool->take(4 * kLarge);
  auto much_smaller = pool->take(kLarge);
  CHECK(pool->kept_bytes() == 3 * kLarge);  // neither took it
  auto fitting = pool->take(2 * kLarge);
  CHECK(pool->kept_bytes() == 0);
}

TEST_CASE("the pool keeps no more than its budget, and small buffers not at all") {
  auto pool = ReceiveBuffers::make(kLarge);
  auto a = pool->take(kLarge);
  auto b = pool->take(kLarge);
  auto small = pool->take(kLarge - 1);
  a.reset();
  b.reset();
  small.reset();
  CHECK(pool->kept_bytes() == kLarge);
}

TEST_CASE("a buffer that outlives its pool is freed") {
  auto pool = ReceiveBuffers::make(kLarge);
  auto buffer = pool->take(kLarge);
  pool.reset();
  buffer->data()[0] = std::byte{1};
  buffer.reset();  // no pool to go back to (ASan builds check the free)
}

TEST_CASE("buffers from 1 MiB up are kept, below the mmap threshold too; smaller ones are not") {
  auto pool = ReceiveBuffers::make(64u << 20);
  pool->take(1u << 20).reset();  // a 1 MiB partition
  CHECK(pool->kept_bytes() == 1u << 20);
  pool->take(16u << 20).reset();  // 16 MiB: malloc's arena could hand its pages back
  CHECK(pool->kept_bytes() == (1u << 20) + (16u << 20));
  pool->take(256u << 10).reset();  // the default partition: malloc reuses it
  CHECK(pool->kept_bytes() == (1u << 20) + (16u << 20));
}
