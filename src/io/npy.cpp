// SPDX-License-Identifier: Apache-2.0
#include "io/npy.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "protokv/error.h"

namespace protokv::io {

void write_npy_f32(const std::string& path, std::span<const float> values, int64_t rows,
                   int64_t cols) {
  PROTOKV_CHECK(rows >= 0 && cols >= 0 &&
                    static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) == values.size(),
                "write_npy_f32: {} values for a [{}, {}] array", values.size(), rows, cols);
  // NEP 1 / numpy.lib.format: magic, version 1.0, little-endian header length, then a Python
  // dict literal padded with spaces and ended by '\n' so that the data starts 64-byte aligned.
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  const size_t preamble = 10;  // magic (6) + version (2) + header length (2)
  header.append(63 - (preamble + header.size()) % 64, ' ');
  header.push_back('\n');
  const std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  PROTOKV_CHECK(file != nullptr, "cannot write {}", path);
  const unsigned char start[preamble] = {0x93,
                                         'N',
                                         'U',
                                         'M',
                                         'P',
                                         'Y',
                                         1,
                                         0,
                                         static_cast<unsigned char>(header.size() & 0xff),
                                         static_cast<unsigned char>(header.size() >> 8)};
  const bool ok =
      std::fwrite(start, 1, preamble, file.get()) == preamble &&
      std::fwrite(header.data(), 1, header.size(), file.get()) == header.size() &&
      std::fwrite(values.data(), sizeof(float), values.size(), file.get()) == values.size() &&
      std::fflush(file.get()) == 0;
  PROTOKV_CHECK(ok, "cannot write {}", path);
}

}  // namespace protokv::io
