// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sharded evaluations (`--shard I/N`): a cluster job array runs N processes, each on every N-th
// sample, and `protokv eval merge` joins their folders into the report one process would have
// written. The split is round-robin over the benchmark's sample list (after --limit): sample k
// belongs to shard (k mod N) + 1, so every shard gets a share of each task, length and depth,
// and a shard's samples keep their global index k for the merge.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace protokv::eval {

struct EvalShard {
  int64_t index = 1;  // 1..count
  int64_t count = 1;  // 1: not sharded
  bool active() const { return count > 1; }
  bool holds(int64_t sample) const { return sample % count == index - 1; }
  std::string to_string() const;  // "2/8"
  // "I/N" with 1 <= I <= N <= limits::kMaxEvalShards; throws Error otherwise.
  static EvalShard parse(std::string_view text);
};

// The global indices of the samples `shard` takes out of `total`.
std::vector<int64_t> shard_sample_indices(const EvalShard& shard, int64_t total);

}  // namespace protokv::eval
