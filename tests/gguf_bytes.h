// SPDX-License-Identifier: Apache-2.0
#pragma once
// Hand-assembled GGUF bytes for the reader's tests (test_gguf_corrupt.cpp, test_limits.cpp):
// little-endian values and length-prefixed strings appended in the order the format lays them out,
// independently of protokv's writer.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace protokv::testing {

class GgufBytes {
 public:
  template <typename T>
  GgufBytes& put(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  GgufBytes& str(std::string_view s) {
    put<uint64_t>(s.size());
    bytes_.append(s);
    return *this;
  }
  GgufBytes& raw(std::string_view s) {
    bytes_.append(s);
    return *this;
  }
  const std::string& bytes() const { return bytes_; }
  std::string& bytes() { return bytes_; }
  size_t size() const { return bytes_.size(); }

 private:
  std::string bytes_;
};

}  // namespace protokv::testing
