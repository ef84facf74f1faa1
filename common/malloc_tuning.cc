// SPDX-License-Identifier: Apache-2.0
#include "common/malloc_tuning.h"

#include <malloc.h>

namespace psched {

void tune_malloc_for_large_messages() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's upper limit for this setting on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace psched
