// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the attention kernels read keys and values from (kernels/kernels.h): a cache head hands
// them its keys as up to three segments (HeadCache::key_segments), some borrowed from a lower
// layer, and its values as one run of rows.
#include <cstdint>

#include "protokv/dtype.h"

namespace protokv {

// Keys of `count` consecutive entries, rows [count, head_dim] of `type` from `keys` (a KV cache
// type: F32, F16, BF16, Q8_0, Q4_0). `query`, when set, replaces the attending query for these
// entries' logits (PoD Eq. 3 with scores=lower: the block's lowest layer's query with its keys);
// for a group of query heads it is [group, d].
struct KeySegment {
  const void* keys = nullptr;
  int64_t count = 0;
  const float* query = nullptr;
  DType type = DType::F32;
};

// Value rows [n, head_dim] of `type` (a KV cache type) from `data`; from a plain float pointer
// they are F32.
struct ValueRows {
  ValueRows(const float* rows) : data(rows) {}  // implicit: F32 rows, as before
  ValueRows(const void* rows, DType rows_type) : data(rows), type(rows_type) {}
  const void* data = nullptr;
  DType type = DType::F32;
};

}  // namespace protokv
