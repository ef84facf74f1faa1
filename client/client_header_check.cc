// SPDX-License-Identifier: Apache-2.0
// Built with every build, never run: fails to compile when a header a trainer includes
// (client/client.h, and the operator view and traces built on it) includes KJ or generated
// Cap'n Proto code, directly or through the headers it includes. Trainers and the Python module
// see only psched's own types; what runs on the client's loop is in client.cc.
#include "client/chrome_trace.h"
#include "client/client.h"
#include "client/worker_monitor.h"

// Every KJ header includes kj/common.h, which defines KJ_BEGIN_HEADER; every Cap'n Proto
// header (generated ones too) includes capnp/common.h, which defines CAPNP_VERSION.
#ifdef KJ_BEGIN_HEADER
#error "a client header includes a KJ header (kj/...): keep KJ types in client.cc"
#endif
#ifdef CAPNP_VERSION
#error "a client header includes a Cap'n Proto header: keep wire types in client.cc"
#endif
