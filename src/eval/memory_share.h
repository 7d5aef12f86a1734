// SPDX-License-Identifier: Apache-2.0
#pragma once
// Equal-memory budgets (--kv-memory-share S): a budget B is not the same memory across methods
// (clusterkv stores every entry, pod keeps every value, chelsea's outlier heads and Gemma 3's
// sliding-window layers keep what B does not bound), so comparing methods "at B = 128" compares
// different memory. A memory share S is solved, per prompt and press, into the budget at which the
// press stores S of the full cache's KV bytes.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "protokv/engine.h"
#include "protokv/model.h"
#include "protokv/press_spec.h"

namespace protokv::eval {

struct MemoryShareBudget {
  int64_t entries = 0;       // the budget to run with (entries per KV head)
  size_t full_kv_bytes = 0;  // what the full cache holds for the prompt
  bool probed = false;       // solved from two trial compressions (else from the budget alone)
};

// The budget at which `press` stores about `share` (in (0, 1]) of the full cache's KV bytes for a
// prompt of `n_tokens`, which `prompt` prefills (called only when trial compressions are needed).
// An evicting press on a model without sliding-window layers stores B entries per head in every
// layer, so B = floor(share * n). Any other press (registered as recalling, merging or key-sharing,
// a press made outside the registry, any press on a model with sliding-window layers) is compressed
// at B = n/2 and 3n/4 (budgets every press accepts) and its stored bytes fitted as a + b * B (exact
// for each of them: what B does not bound is a constant a), then B = floor((share * full - a) / b),
// at most n. Throws Error when no budget reaches the share (a press that stores a constant amount,
// such as clusterkv, or a share below what B = 1 would store), naming the press and the smallest
// share. With a KV cache type, the share is of the full cache of that type (`prompt` must be
// prefilled into it): every press then stores that share of the same bytes.
MemoryShareBudget solve_memory_share(const ModelWeights& weights,
                                     const std::shared_ptr<const PressSpec>& press,
                                     int64_t n_tokens,
                                     const std::function<const PrefilledPrompt&()>& prompt,
                                     double share, KvCacheType cache_type = {});

}  // namespace protokv::eval
