// SPDX-License-Identifier: Apache-2.0
#pragma once
// The tensor view every layer shares: model weights hold them, loaders fill them, kernels read
// them. Below protokv/model.h so that the kernels need not know what a model is.
#include <cstddef>
#include <cstdint>

#include "protokv/dtype.h"

namespace protokv {

// A 2-D weight: `rows` output features, each a contiguous row of `cols` input features in `type`
// (ggml's ne[0] == cols). Row r starts at data + r * dtype_row_bytes(type, cols).
struct WeightMatrix {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;

  const void* row(int64_t r) const {
    return static_cast<const char*>(data) + static_cast<size_t>(r) * dtype_row_bytes(type, cols);
  }
  size_t bytes() const { return static_cast<size_t>(rows) * dtype_row_bytes(type, cols); }
};

}  // namespace protokv
