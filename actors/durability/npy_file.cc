// SPDX-License-Identifier: Apache-2.0
#include "actors/durability/npy_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>

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

namespace {

// The value of `key` in a .npy header's dictionary: the text after "'key':" up to the next
// top-level ',' or '}' (a tuple's commas are inside its parentheses), trimmed; empty if absent.
std::string header_value(std::string_view dict, std::string_view key) {
  const size_t at = dict.find(fmt::format("'{}':", key));
  if (at == std::string_view::npos) return {};
  size_t end = at + key.size() + 3;
  int depth = 0;
  for (; end < dict.size(); ++end) {
    const char c = dict[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  std::string_view value = dict.substr(at + key.size() + 3, end - at - key.size() - 3);
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
  return std::string(value);
}

// `length` bytes of `file` from `offset` (fewer where it ends).
std::vector<std::byte> read_range(const std::filesystem::path& file, uint64_t offset,
                                  uint64_t length) {
  std::ifstream in(file, std::ios::binary);
  std::vector<std::byte> out(length);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(length));
  out.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return out;
}

// A header's shape, "(3, 4)" or "(3,)" or "()"; false when it is none.
bool parse_shape(std::string_view text, std::vector<uint64_t>& out) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') return false;
  text = text.substr(1, text.size() - 2);
  while (!text.empty()) {
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    if (text.empty()) break;
    uint64_t d = 0;
    size_t digits = 0;
    for (; digits < text.size() && text[digits] >= '0' && text[digits] <= '9'; ++digits)
      d = d * 10 + static_cast<uint64_t>(text[digits] - '0');
    if (digits == 0) return false;
    out.push_back(d);
    text.remove_prefix(digits);
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    if (!text.empty() && text.front() != ',') return false;
    if (!text.empty()) text.remove_prefix(1);
  }
  return true;
}

}  // namespace

NpyReader::NpyReader(std::filesystem::path file) : file_(std::move(file)) {
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(file_, error);
  if (error) fail(ErrorCode::bad_config, "{}: cannot be read: {}", file_.string(), error.message());
  std::vector<std::byte> head = read_range(file_, 0, std::min<uint64_t>(size, 12));
  auto byte = [&](size_t i) { return std::to_integer<uint64_t>(head[i]); };
  if (head.size() < 10 || std::memcmp(head.data(), "\x93NUMPY", 6) != 0 || byte(6) < 1 ||
      byte(6) > 3)
    fail(ErrorCode::bad_config, "{}: not a .npy file (no \\x93NUMPY magic of version 1 to 3)",
         file_.string());
  const bool wide = byte(6) >= 2;  // version 2 and 3: a 4-byte header length
  if (wide && head.size() < 12) fail(ErrorCode::bad_config, "{}: truncated header", file_.string());
  const uint64_t length =
      wide ? byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24 : byte(8) | byte(9) << 8;
  data_at_ = (wide ? 12 : 10) + length;
  if (data_at_ > size) fail(ErrorCode::bad_config, "{}: truncated header", file_.string());
  const std::vector<std::byte> dict_bytes = read_range(file_, wide ? 12 : 10, length);
  const std::string dict(reinterpret_cast<const char*>(dict_bytes.data()), dict_bytes.size());
  descr_ = header_value(dict, "descr");
  if (descr_.size() >= 2 && descr_.front() == '\'' && descr_.back() == '\'')
    descr_ = descr_.substr(1, descr_.size() - 2);
  if (header_value(dict, "fortran_order") != "False")
    fail(ErrorCode::bad_config, "{}: not in C order (fortran_order is not False)", file_.string());
  if (descr_.empty() || !parse_shape(header_value(dict, "shape"), shape_))
    fail(ErrorCode::bad_config, "{}: a header without descr or shape: {}", file_.string(), dict);
  data_bytes_ = size - data_at_;
  source_ = std::make_unique<FileSource>(file_, data_at_, data_bytes_);
}

NpyReader::~NpyReader() = default;

void NpyReader::expect(std::string_view what, std::initializer_list<std::string_view> descrs,
                       const std::vector<uint64_t>& shape) const {
  const bool known = std::find(descrs.begin(), descrs.end(), descr_) != descrs.end();
  if (!known || shape != shape_)
    fail(ErrorCode::bad_config,
         "{} ({}) is '{}' of shape ({}) where '{}' of shape ({}) is expected", what, file_.string(),
         descr_, fmt::join(shape_, ", "), fmt::join(descrs, "' or '"), fmt::join(shape, ", "));
  uint64_t elements = 1;
  for (uint64_t d : shape) elements *= d;
  const uint64_t bytes = elements * (descr_.back() == '8' ? 8 : 4);
  if (data_bytes_ < bytes)
    fail(ErrorCode::bad_config, "{} ({}) holds {} bytes of data where its shape needs {}", what,
         file_.string(), data_bytes_, bytes);
}

void NpyReader::read(std::span<std::byte> out) {
  if (read_ + out.size() > data_bytes_)
    fail(ErrorCode::bad_config, "{}: ends at byte {} of its data, {} more asked for",
         file_.string(), data_bytes_, read_ + out.size() - data_bytes_);
  source_->read(out);
  read_ += out.size();
}

std::string_view npy_descr(DType dtype) {
  return dtype == DType::float64 ? "<f8" : "<f4";
}

}  // namespace psched
