// SPDX-License-Identifier: Apache-2.0
// NpyFile: a numpy .npy file (format version 1.0) written as a stream, for `psched export`
// (actors/shard/model_export.h); NpyReader reads one back as a stream, for `psched import`. The
// shape is known before the first element (a checkpoint's table heads count its rows), so the
// header is written first and the elements follow in C order, a piece at a time, never held whole;
// finish() checks that they add up to the shape. numpy.load reads the file, and with mmap_mode="r"
// maps it without reading it.
//
// The header is padded to a multiple of 64 bytes, as numpy writes it, so the data starts aligned
// for a memory map. Little-endian machines only (the dtype strings say '<').
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"

namespace psched {

class FileSource;

class NpyFile {
 public:
  // Creates `file` (truncating one that exists) and writes the header of an array of `descr`
  // (numpy's dtype string: "<f4", "<f8", "<u8") and `shape` (empty: a scalar). Throws
  // Error(io_error) naming the file and the OS error when it cannot be created or written.
  NpyFile(std::filesystem::path file, std::string_view descr, std::vector<uint64_t> shape,
          size_t element_bytes);
  // Closes the file; one not finished stays short (its caller removes it).
  ~NpyFile();
  NpyFile(const NpyFile&) = delete;
  NpyFile& operator=(const NpyFile&) = delete;

  // Appends `bytes`, the next elements in C order. Throws Error(io_error) naming the file when
  // the write fails, and Error(invalid_argument) when they would go past the shape.
  void write(std::span<const std::byte> bytes);
  // Syncs and closes the file. Throws Error(io_error) when fewer bytes than the shape holds were
  // written (naming both counts) or the sync fails.
  void finish();

  // Bytes of elements the shape holds, and written so far.
  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t written() const { return written_; }
  const std::filesystem::path& file() const { return file_; }

  // The header, magic to newline, of an array of `descr` and `shape` (a multiple of 64 bytes).
  static std::string header(std::string_view descr, const std::vector<uint64_t>& shape);

 private:
  std::filesystem::path file_;
  int fd_ = -1;
  uint64_t data_bytes_;
  uint64_t written_ = 0;
};

// A .npy file read as a stream (`psched import`, actors/shard/model_import.h): the header parsed
// when it is opened, the elements read in C order a piece at a time through FileSource's buffer.
// Reads version 1.0, 2.0 and 3.0 headers as numpy writes them; little-endian, C order only.
class NpyReader {
 public:
  // Opens `file` and reads its header. Throws Error(bad_config) naming the file when it is
  // missing, no .npy file, in Fortran order, or shorter than its header says.
  explicit NpyReader(std::filesystem::path file);
  ~NpyReader();
  NpyReader(const NpyReader&) = delete;
  NpyReader& operator=(const NpyReader&) = delete;

  // Throws Error(bad_config) naming the file, `what` it holds ("table 't' values") and both
  // sides unless its descr is one of `descrs` and its shape is `shape`.
  void expect(std::string_view what, std::initializer_list<std::string_view> descrs,
              const std::vector<uint64_t>& shape) const;
  // The next out.size() bytes of elements. Throws Error(bad_config) naming the file when it has
  // fewer left.
  void read(std::span<std::byte> out);

  const std::string& descr() const { return descr_; }
  const std::vector<uint64_t>& shape() const { return shape_; }
  const std::filesystem::path& file() const { return file_; }

 private:
  std::filesystem::path file_;
  std::string descr_;
  std::vector<uint64_t> shape_;
  uint64_t data_at_ = 0, data_bytes_ = 0, read_ = 0;
  std::unique_ptr<FileSource> source_;
};

// numpy's dtype string of `dtype`: "<f4" for float32, "<f8" for float64.
std::string_view npy_descr(DType dtype);

}  // namespace psched
