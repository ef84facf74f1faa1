// SPDX-License-Identifier: Apache-2.0
#include "actors/durability/npy_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/durability/file_io.h"
#include "common/error.h"

namespace psched {

static_assert(std::endian::native == std::endian::little, "the .npy headers say '<'");

namespace {

[[noreturn]] void failed(const char* what, const std::filesystem::path& file) {
  fail(ErrorCode::io_error, "{} {} failed: {}", what, file.string(), std::strerror(errno));
}

}  // namespace

std::string NpyFile::header(std::string_view descr, const std::vector<uint64_t>& shape) {
  // Python's tuples: (), (n,), (n, m).
  std::string dims =
      shape.size() == 1 ? fmt::format("{},", shape[0]) : fmt::format("{}", fmt::join(shape, ", "));
  std::string dict =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, dims);
  // magic (6) + version (2) + length (2) + dict + spaces + '\n': a multiple of 64.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict;
}

NpyFile::NpyFile(std::filesystem::path file, std::string_view descr, std::vector<uint64_t> shape,
                 size_t element_bytes)
    : file_(std::move(file)), data_bytes_(element_bytes) {
  for (uint64_t d : shape) data_bytes_ *= d;
  fd_ = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) failed("creating", file_);
  const std::string head = header(descr, shape);
  if (!write_all(fd_, {io(head.data(), head.size())})) failed("writing", file_);
}

NpyFile::~NpyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void NpyFile::write(std::span<const std::byte> bytes) {
  if (written_ + bytes.size() > data_bytes_)
    fail(ErrorCode::invalid_argument, "{}: {} bytes more would go past its {} bytes of data",
         file_.string(), bytes.size(), data_bytes_ - written_);
  if (!write_all(fd_, {io(bytes.data(), bytes.size())})) failed("writing", file_);
  written_ += bytes.size();
}

void NpyFile::finish() {
  if (written_ != data_bytes_)
    fail(ErrorCode::io_error, "{}: {} bytes of data written where its shape holds {}",
         file_.string(), written_, data_bytes_);
  if (::fsync(fd_) != 0) failed("syncing", file_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) failed("closing", file_);
}

std::string_view npy_descr(DType dtype) {
  return dtype == DType::float64 ? "<f8" : "<f4";
}

}  // namespace psched
