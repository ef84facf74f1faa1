// SPDX-License-Identifier: Apache-2.0
#include "net/cluster_layout.h"

#include <doctest/doctest.h>

#include "common/error.h"

using namespace psched;

namespace {

std::vector<ClusterLayout> two_shards() {
  ClusterLayout layout;
  layout.shard_addresses = {"127.0.0.1:7410", "127.0.0.1:7411"};
  layout.split_bytes = 4 << 20;
  layout.workers = 2;
  layout.max_message_bytes = 64 << 20;
  std::vector<ClusterLayout> layouts{layout, layout};
  layouts[1].shard_index = ShardId(1);
  return layouts;
}

}  // namespace

TEST_CASE("shards started from one deployment file agree") {
  CHECK_NOTHROW(check_same_cluster(two_shards()));
}

TEST_CASE("shards that disagree on the mode or the worker count are a bad config naming the key") {
  auto layouts = two_shards();
  layouts[1].mode = Mode::sync;
  CHECK_THROWS_WITH_AS(check_same_cluster(layouts), doctest::Contains("disagree on 'mode'"), Error);
  layouts = two_shards();
  layouts[1].workers = 3;
  CHECK_THROWS_WITH_AS(check_same_cluster(layouts), doctest::Contains("disagree on 'workers'"),
                       Error);
  layouts = two_shards();
  layouts[1].default_optimizer.lr = 0.5;
  CHECK_THROWS_WITH_AS(check_same_cluster(layouts), doctest::Contains("disagree on 'optimizer'"),
                       Error);
}
