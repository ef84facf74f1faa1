// SPDX-License-Identifier: Apache-2.0
// Byte sizes as people write them in config files: "4194304", "4MiB", "512 KiB", "2MB".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace psched {

// Parses a whole number of bytes with an optional unit, optionally after one space:
// B; binary KiB MiB GiB TiB (powers of 1024); decimal KB (or kB) MB GB TB (powers of 1000).
// Returns nullopt for anything else: fractions, signs, unknown units, values over 2^64-1.
std::optional<uint64_t> parse_byte_size(std::string_view text);

// The shortest exact spelling parse_byte_size reads back: "4MiB", "1000B", "0B".
std::string format_byte_size(uint64_t bytes);

}  // namespace psched
