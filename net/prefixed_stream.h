// SPDX-License-Identifier: Apache-2.0
// A stream whose first reads return bytes already read from it: a listener that looked at a
// connection's first bytes to tell what it carries hands the whole stream on.
#pragma once

#include <kj/async-io.h>

namespace psched {

// `stream`, reading `prefix` before the bytes still in it.
kj::Own<kj::AsyncIoStream> with_prefix(kj::Own<kj::AsyncIoStream> stream,
                                       kj::Array<kj::byte> prefix);

}  // namespace psched
