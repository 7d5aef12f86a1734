// SPDX-License-Identifier: Apache-2.0
#pragma once
// NumPy's .npy format (version 1.0), float32 row-major matrices only: what `numpy.load` reads
// without pickle. For dumping engine outputs (logits) that Python compares against.
#include <cstdint>
#include <span>
#include <string>

namespace protokv::io {

// Writes `values` as a float32 [rows, cols] array. Throws Error when values.size() !=
// rows * cols or the file cannot be written.
void write_npy_f32(const std::string& path, std::span<const float> values, int64_t rows,
                   int64_t cols);

}  // namespace protokv::io
