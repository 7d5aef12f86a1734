// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the attention kernels read keys from (kernels/kernels.h): a cache head hands them its keys
// as up to three such segments (HeadCache::key_segments), some borrowed from a lower layer.
#include <cstdint>

namespace protokv {

// Keys of `count` consecutive entries, rows [count, head_dim] from `keys`. `query`, when set,
// replaces the attending query for these entries' logits (PoD Eq. 3 with scores=lower: the
// block's lowest layer's query with its keys); for a group of query heads it is [group, d].
struct KeySegment {
  const float* keys = nullptr;
  int64_t count = 0;
  const float* query = nullptr;
};

}  // namespace protokv
