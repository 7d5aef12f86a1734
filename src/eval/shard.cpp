// SPDX-License-Identifier: Apache-2.0
#include "eval/shard.h"

#include <fmt/format.h>

#include <charconv>

#include "protokv/error.h"
#include "protokv/limits.h"

namespace protokv::eval {

std::string EvalShard::to_string() const {
  return fmt::format("{}/{}", index, count);
}

EvalShard EvalShard::parse(std::string_view text) {
  const size_t slash = text.find('/');
  EvalShard shard;
  auto number = [&](std::string_view piece, int64_t& out) {
    const auto [end, ec] = std::from_chars(piece.data(), piece.data() + piece.size(), out);
    return ec == std::errc() && end == piece.data() + piece.size();
  };
  const bool ok = slash != std::string_view::npos && number(text.substr(0, slash), shard.index) &&
                  number(text.substr(slash + 1), shard.count);
  PROTOKV_CHECK(ok && shard.count >= 1 && shard.count <= limits::kMaxEvalShards &&
                    shard.index >= 1 && shard.index <= shard.count,
                "--shard: '{}' is not I/N with 1 <= I <= N <= {} (e.g. 2/8: the second of eight)",
                text, limits::kMaxEvalShards);
  return shard;
}

std::vector<int64_t> shard_sample_indices(const EvalShard& shard, int64_t total) {
  std::vector<int64_t> indices;
  for (int64_t k = shard.index - 1; k < total; k += shard.count) indices.push_back(k);
  return indices;
}

}  // namespace protokv::eval
