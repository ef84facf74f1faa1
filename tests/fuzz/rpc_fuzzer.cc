// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: each input is one client connection's bytes (RPC messages, or a data
// stream's frames) into a fresh shard (see fuzz_shard.h). Built only with -DPSCHED_FUZZ=ON and
// clang; run it with scripts/fuzz.
#include <cstddef>
#include <cstdint>

#include "common/log.h"
#include "tests/fuzz/fuzz_shard.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  psched::set_log_level(psched::LogLevel::error);  // a dropped connection per input is normal
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psched::fuzz::run_input({data, size});
  return 0;
}
