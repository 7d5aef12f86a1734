// SPDX-License-Identifier: Apache-2.0
#include "eval/shard.h"

#include <fmt/format.h>

#include <charconv>
#include <filesystem>

#include "eval/results_file.h"
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

int64_t shard_sample_count(const EvalShard& shard, int64_t total) {
  const int64_t first = shard.index - 1;
  return total > first ? (total - first + shard.count - 1) / shard.count : 0;
}

ShardFolder read_shard_folder(const std::string& dir) {
  ShardFolder f;
  f.dir = dir;
  f.config = read_json_object_file((std::filesystem::path(dir) / "config.json").string());
  if (!f.config.contains("shard")) return f;
  try {
    const nlohmann::json& s = f.config["shard"];
    f.shard.index = s.at("index").get<int64_t>();
    f.shard.count = s.at("count").get<int64_t>();
    f.samples = s.value("samples", int64_t{-1});
  } catch (const nlohmann::json::exception& e) {
    fail("{}/config.json: shard: {}", dir, e.what());
  }
  PROTOKV_CHECK(f.shard.count >= 1 && f.shard.count <= limits::kMaxEvalShards &&
                    f.shard.index >= 1 && f.shard.index <= f.shard.count,
                "{}/config.json: shard {}/{} is not a shard", dir, f.shard.index, f.shard.count);
  f.config.erase("shard");
  return f;
}

namespace {

// The first top-level key whose value differs between two configurations ("threads" aside).
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b) {
  for (const auto& [key, value] : a.items())
    if (key != "threads" && (!b.contains(key) || b[key] != value)) return key;
  for (const auto& [key, value] : b.items())
    if (key != "threads" && !a.contains(key)) return key;
  return "";
}

}  // namespace

nlohmann::json check_shard_set(const std::vector<ShardFolder>& folders) {
  PROTOKV_CHECK(!folders.empty(), "eval merge: no folder given");
  const ShardFolder& first = folders.front();
  const int64_t count = first.shard.count;
  std::vector<const ShardFolder*> by_index(static_cast<size_t>(count), nullptr);
  nlohmann::json threads = first.config.value("threads", nlohmann::json());
  for (const auto& f : folders) {
    const std::string key = first_difference(first.config, f.config);
    PROTOKV_CHECK(key.empty(),
                  "{} and {} are not shards of one run: their configurations differ in \"{}\"",
                  first.dir, f.dir, key);
    PROTOKV_CHECK(f.shard.count == count && f.samples == first.samples,
                  "{} is shard {} (of {} samples), {} shard {} (of {}): not one run's shards",
                  f.dir, f.shard.to_string(), f.samples, first.dir, first.shard.to_string(),
                  first.samples);
    const ShardFolder*& slot = by_index[static_cast<size_t>(f.shard.index - 1)];
    PROTOKV_CHECK(slot == nullptr, "shard {} is given twice: {} and {}", f.shard.to_string(),
                  slot == nullptr ? "" : slot->dir, f.dir);
    slot = &f;
    if (f.config.value("threads", nlohmann::json()) != threads) threads = "differ per shard";
  }
  for (int64_t i = 0; i < count; ++i)
    PROTOKV_CHECK(by_index[static_cast<size_t>(i)] != nullptr,
                  "shard {}/{} is missing: give every shard's folder", i + 1, count);
  nlohmann::json config = first.config;
  if (!threads.is_null()) config["threads"] = threads;
  return config;
}

}  // namespace protokv::eval
