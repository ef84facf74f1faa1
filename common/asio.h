// SPDX-License-Identifier: Apache-2.0
// Boost.Asio, included the one way psched includes it.
#pragma once

#include <utility>  // Boost 1.74's Asio misses it under g++ 12 / C++20; keep before Asio.

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
