// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sharded evaluations (`--shard I/N`): a cluster job array runs N processes, each on every N-th
// sample, and `protokv eval merge` joins their folders into the report one process would have
// written. The split is round-robin over the benchmark's sample list (after --limit): sample k
// belongs to shard (k mod N) + 1, so every shard gets a share of each task, length and depth,
// and a shard's samples keep their global index k for the merge.
#include <cstdint>
#include <nlohmann/json.hpp>
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

// How many of `total` samples `shard` holds (computed, nothing allocated: `total` may come from
// a file).
int64_t shard_sample_count(const EvalShard& shard, int64_t total);

// A finished run's output folder as `protokv eval merge` reads it.
struct ShardFolder {
  std::string dir;
  nlohmann::json config;  // its config.json without "shard"
  EvalShard shard;        // 1/1 for an unsharded run
  int64_t samples = -1;   // the whole run's sample count, where "shard" states it
};

// Reads DIR/config.json. Throws Error naming the file when it is missing (the run did not
// finish), not a JSON object, or holds a malformed "shard".
ShardFolder read_shard_folder(const std::string& dir);

// Checks that `folders` are every shard 1/N..N/N of one run, each once, all with one
// configuration ("threads" aside); throws Error naming the folders otherwise. Returns the merged
// run's configuration: the first folder's, "threads" the common value or "differ per shard".
nlohmann::json check_shard_set(const std::vector<ShardFolder>& folders);

}  // namespace protokv::eval
