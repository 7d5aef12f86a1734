// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reader of Hugging Face safetensors files over a memory mapping: an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data region. Every structural fact is validated at open() so a corrupt file gives one
// Error line, never an out-of-bounds read. Only the floating-point types a Llama-family checkpoint
// holds are accepted (F32, F16, BF16).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "protokv/dtype.h"

namespace protokv {

struct SafetensorsTensor {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;  // row-major (PyTorch order): shape.back() is contiguous
  const void* data = nullptr;  // inside the mapping; no alignment guaranteed
  size_t nbytes = 0;
  int64_t element_count() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header: length inside the file, a JSON object, for every tensor
  // a supported dtype, a shape of non-negative sizes, data_offsets inside the data region whose
  // length is shape x dtype size, and no two tensors overlapping. "__metadata__" is ignored.
  // Throws Error ("<path>: ...") on any problem.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  // Sorted by data offset (file order).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  // Keeps the mapping alive.
  std::shared_ptr<const void> mapping() const { return mapping_; }

 private:
  std::string path_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::shared_ptr<const void> mapping_;
};

}  // namespace protokv
