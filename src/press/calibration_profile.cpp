// SPDX-License-Identifier: Apache-2.0
#include "press/calibration_profile.h"
#include "protokv/limits.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "protokv/error.h"

namespace protokv::press {
namespace {

using nlohmann::json;

// Reads one JSON object, naming fields by their dotted path in every error.
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void error(const std::string& path, const std::string& what) const {
    fail("calibration profile {}: {} {}", origin_, path, what);
  }

  // `j` must be an object holding exactly `keys`.
  void expect_object(const json& j, const std::string& path,
                     std::initializer_list<std::string_view> keys) const {
    if (!j.is_object()) error(path, "must be an object");
    for (std::string_view key : keys)
      if (!j.contains(key)) error(join(path, key), "is missing");
    for (const auto& item : j.items()) {
      bool known = false;
      for (std::string_view key : keys) known = known || item.key() == key;
      if (!known)
        error(join(path, item.key()),
              fmt::format("is not a field (expected: {})", fmt::join(keys, ", ")));
    }
  }

  int64_t integer(const json& j, const std::string& path, int64_t min, int64_t max) const {
    if (!j.is_number_integer()) error(path, "must be an integer");
    const auto value = j.get<int64_t>();
    if (value < min || value > max)
      error(path, fmt::format("= {} is outside [{}, {}]", value, min, max));
    return value;
  }

  double number(const json& j, const std::string& path, double min, double max) const {
    if (!j.is_number()) error(path, "must be a number");
    const auto value = j.get<double>();
    if (!std::isfinite(value) || value < min || value > max)
      error(path, fmt::format("= {} is outside [{}, {}]", value, min, max));
    return value;
  }

  std::string text(const json& j, const std::string& path) const {
    if (!j.is_string()) error(path, "must be a string");
    return j.get<std::string>();
  }

  // An array of `rows` arrays of `columns` values each, every value read by `read`.
  template <typename T, typename Read>
  std::vector<std::vector<T>> matrix(const json& j, const std::string& path, int64_t rows,
                                     int64_t columns, Read read) const {
    if (!j.is_array() || static_cast<int64_t>(j.size()) != rows)
      error(path, fmt::format("must be an array of {} rows", rows));
    std::vector<std::vector<T>> out(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const json& row = j[static_cast<size_t>(r)];
      const std::string row_path = fmt::format("{}[{}]", path, r);
      if (!row.is_array() || static_cast<int64_t>(row.size()) != columns)
        error(row_path, fmt::format("must be an array of {} values", columns));
      for (int64_t c = 0; c < columns; ++c)
        out[static_cast<size_t>(r)].push_back(
            read(row[static_cast<size_t>(c)], fmt::format("{}[{}]", row_path, c)));
    }
    return out;
  }

 private:
  static std::string join(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
  }
  std::string origin_;
};

// Objects one field a line; an array of scalars on one line (a matrix: one row a line).
void write_pretty(const nlohmann::ordered_json& j, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent) + 2, ' ');
  if (j.is_object() && !j.empty()) {
    out += "{\n";
    size_t i = 0;
    for (const auto& item : j.items()) {
      out += pad + json(item.key()).dump() + ": ";
      write_pretty(item.value(), indent + 2, out);
      out += ++i < j.size() ? ",\n" : "\n";
    }
    out += std::string(static_cast<size_t>(indent), ' ') + "}";
    return;
  }
  const bool nested = j.is_array() && std::any_of(j.begin(), j.end(),
                                                  [](const auto& e) { return e.is_structured(); });
  if (!nested) {
    out += j.dump();
    return;
  }
  out += "[\n";
  for (size_t i = 0; i < j.size(); ++i) {
    out += pad;
    write_pretty(j[i], indent + 2, out);
    out += i + 1 < j.size() ? ",\n" : "\n";
  }
  out += std::string(static_cast<size_t>(indent), ' ') + "]";
}

// Limits a profile's shape may not exceed (a corrupt file must not allocate without bound).
constexpr int64_t kMaxLayers = limits::kMaxProfileLayers;
constexpr int64_t kMaxHeads = limits::kMaxProfileHeads;
constexpr int64_t kMaxHeadDim = limits::kMaxProfileHeadDim;

}  // namespace

nlohmann::ordered_json calibration_profile_to_json(const CalibrationProfile& p) {
  nlohmann::ordered_json chelsea_outlier = nlohmann::ordered_json::array();
  for (const auto& row : p.chelsea_outlier) {
    nlohmann::ordered_json r = nlohmann::ordered_json::array();
    for (uint8_t flag : row) r.push_back(static_cast<int>(flag));
    chelsea_outlier.push_back(std::move(r));
  }
  return {
      {"format", kCalibrationProfileFormat},
      {"version", p.version},
      {"model",
       {{"file", p.model_file},
        {"name", p.model_name},
        {"n_layers", p.n_layers},
        {"n_heads", p.n_heads},
        {"n_kv_heads", p.n_kv_heads},
        {"head_dim", p.head_dim}}},
      {"source",
       {{"kind", p.source_kind},
        {"name", p.source_name},
        {"samples", p.samples},
        {"tokens", p.tokens}}},
      {"chelsea",
       {{"threshold", p.chelsea_threshold},
        {"outlier_fraction", p.chelsea_fraction},
        {"layout",
         {{"sinks", p.chelsea_layout.sinks},
          {"recent", p.chelsea_layout.recent},
          {"chunk", p.chelsea_layout.chunk}}},
        {"unlinked_share", p.chelsea_unlinked_share},
        {"outlier", chelsea_outlier}}},
      {"pod",
       {{"delta", p.pod_delta},
        {"rows", p.pod_rows},
        {"similarity", p.pod_similarity},
        {"block_start", p.pod_block_start}}},
  };
}

CalibrationProfile calibration_profile_from_json(const json& j, const std::string& origin) {
  const Reader r(origin);
  if (!j.is_object()) r.error("the top level", "must be a JSON object");
  if (!j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != kCalibrationProfileFormat)
    r.error("format",
            fmt::format("must be \"{}\" (not a calibration profile?)", kCalibrationProfileFormat));
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int64_t>() != kCalibrationProfileVersion)
    r.error("version",
            fmt::format("= {} is not supported: this protokv reads version {} (run protokv "
                        "calibrate again)",
                        j.contains("version") ? j["version"].dump() : "(missing)",
                        kCalibrationProfileVersion));
  r.expect_object(j, "", {"format", "version", "model", "source", "chelsea", "pod"});

  CalibrationProfile p;
  const json& model = j["model"];
  r.expect_object(model, "model",
                  {"file", "name", "n_layers", "n_heads", "n_kv_heads", "head_dim"});
  p.model_file = r.text(model["file"], "model.file");
  p.model_name = r.text(model["name"], "model.name");
  p.n_layers = static_cast<int>(r.integer(model["n_layers"], "model.n_layers", 1, kMaxLayers));
  p.n_heads = static_cast<int>(r.integer(model["n_heads"], "model.n_heads", 1, kMaxHeads));
  p.n_kv_heads = static_cast<int>(r.integer(model["n_kv_heads"], "model.n_kv_heads", 1, kMaxHeads));
  p.head_dim = static_cast<int>(r.integer(model["head_dim"], "model.head_dim", 1, kMaxHeadDim));

  const json& source = j["source"];
  r.expect_object(source, "source", {"kind", "name", "samples", "tokens"});
  p.source_kind = r.text(source["kind"], "source.kind");
  p.source_name = r.text(source["name"], "source.name");
  p.samples = r.integer(source["samples"], "source.samples", 1, int64_t{1} << 40);
  p.tokens = r.integer(source["tokens"], "source.tokens", 1, int64_t{1} << 40);

  const json& chelsea = j["chelsea"];
  r.expect_object(chelsea, "chelsea",
                  {"threshold", "outlier_fraction", "layout", "unlinked_share", "outlier"});
  p.chelsea_threshold = r.number(chelsea["threshold"], "chelsea.threshold", -1.0, 1.0);
  p.chelsea_fraction = r.number(chelsea["outlier_fraction"], "chelsea.outlier_fraction", 0.0, 1.0);
  const json& layout = chelsea["layout"];
  r.expect_object(layout, "chelsea.layout", {"sinks", "recent", "chunk"});
  p.chelsea_layout.sinks = r.integer(layout["sinks"], "chelsea.layout.sinks", 0, int64_t{1} << 40);
  p.chelsea_layout.recent =
      r.integer(layout["recent"], "chelsea.layout.recent", 0, int64_t{1} << 40);
  p.chelsea_layout.chunk = r.integer(layout["chunk"], "chelsea.layout.chunk", 2, int64_t{1} << 40);
  p.chelsea_unlinked_share =
      r.matrix<float>(chelsea["unlinked_share"], "chelsea.unlinked_share", p.n_layers, p.n_kv_heads,
                      [&](const json& v, const std::string& path) {
                        return static_cast<float>(r.number(v, path, 0.0, 1.0));
                      });
  p.chelsea_outlier = r.matrix<uint8_t>(chelsea["outlier"], "chelsea.outlier", p.n_layers,
                                        p.n_kv_heads, [&](const json& v, const std::string& path) {
                                          return static_cast<uint8_t>(r.integer(v, path, 0, 1));
                                        });

  const json& pod = j["pod"];
  r.expect_object(pod, "pod", {"delta", "rows", "similarity", "block_start"});
  p.pod_delta = r.number(pod["delta"], "pod.delta", 0.0, 1.0);
  p.pod_rows = r.integer(pod["rows"], "pod.rows", 1, int64_t{1} << 40);
  p.pod_similarity = r.matrix<double>(
      pod["similarity"], "pod.similarity", p.n_kv_heads,
      static_cast<int64_t>(p.n_layers) * p.n_layers,
      [&](const json& v, const std::string& path) { return r.number(v, path, 0.0, 1.0); });
  p.pod_block_start = r.matrix<int>(pod["block_start"], "pod.block_start", p.n_kv_heads, p.n_layers,
                                    [&](const json& v, const std::string& path) {
                                      return static_cast<int>(r.integer(v, path, 0, kMaxLayers));
                                    });
  validate_calibration_profile(p, origin);
  return p;
}

void validate_calibration_profile(const CalibrationProfile& p, const std::string& origin) {
  const Reader r(origin);
  if (p.version != kCalibrationProfileVersion)
    r.error("version", fmt::format("= {} is not {}", p.version, kCalibrationProfileVersion));
  if (p.n_layers < 1 || p.n_heads < 1 || p.n_kv_heads < 1 || p.head_dim < 1)
    r.error("model", "needs at least one layer, head and head_dim");
  if (p.n_heads % p.n_kv_heads != 0)
    r.error("model.n_heads",
            fmt::format("= {} is not a multiple of n_kv_heads = {}", p.n_heads, p.n_kv_heads));
  if (p.samples < 1 || p.tokens < 1) r.error("source", "needs at least one sample of one token");
  const auto layers = static_cast<size_t>(p.n_layers);
  const auto kv_heads = static_cast<size_t>(p.n_kv_heads);
  const auto shaped = [&](const auto& m, size_t rows, size_t columns) {
    if (m.size() != rows) return false;
    for (const auto& row : m)
      if (row.size() != columns) return false;
    return true;
  };
  if (!shaped(p.chelsea_unlinked_share, layers, kv_heads))
    r.error("chelsea.unlinked_share", fmt::format("must be [{}][{}]", layers, kv_heads));
  if (!shaped(p.chelsea_outlier, layers, kv_heads))
    r.error("chelsea.outlier", fmt::format("must be [{}][{}]", layers, kv_heads));
  for (size_t l = 0; l < layers; ++l)
    for (size_t h = 0; h < kv_heads; ++h) {
      const float share = p.chelsea_unlinked_share[l][h];
      if (!(share >= 0.0f && share <= 1.0f))
        r.error(fmt::format("chelsea.unlinked_share[{}][{}]", l, h),
                fmt::format("= {} is outside [0, 1]", share));
      if (p.chelsea_outlier[l][h] > 1)
        r.error(fmt::format("chelsea.outlier[{}][{}]", l, h), "must be 0 or 1");
    }
  if (!(p.chelsea_threshold >= -1.0 && p.chelsea_threshold <= 1.0))
    r.error("chelsea.threshold", "must be in [-1, 1]");
  if (!(p.chelsea_fraction >= 0.0 && p.chelsea_fraction <= 1.0))
    r.error("chelsea.outlier_fraction", "must be in [0, 1]");
  if (p.chelsea_layout.sinks < 0 || p.chelsea_layout.recent < 0 || p.chelsea_layout.chunk < 2)
    r.error("chelsea.layout", "needs sinks >= 0, recent >= 0 and chunk >= 2");

  if (!(p.pod_delta >= 0.0 && p.pod_delta <= 1.0)) r.error("pod.delta", "must be in [0, 1]");
  if (p.pod_rows < 1) r.error("pod.rows", "must be at least 1");
  if (!shaped(p.pod_similarity, kv_heads, layers * layers))
    r.error("pod.similarity", fmt::format("must be [{}][{}]", kv_heads, layers * layers));
  if (!shaped(p.pod_block_start, kv_heads, layers))
    r.error("pod.block_start", fmt::format("must be [{}][{}]", kv_heads, layers));
  for (size_t h = 0; h < kv_heads; ++h) {
    for (size_t i = 0; i < layers; ++i)
      for (size_t j = 0; j < layers; ++j) {
        const double s = p.pod_similarity[h][i * layers + j];
        const std::string path = fmt::format("pod.similarity[{}][{}]", h, i * layers + j);
        if (!(s >= 0.0 && s <= 1.0)) r.error(path, fmt::format("= {} is outside [0, 1]", s));
        if (s != p.pod_similarity[h][j * layers + i])
          r.error(path, fmt::format("(layers {} and {}) is not symmetric", i, j));
      }
    // Blocks are runs of consecutive layers: each layer starts a block or continues the one
    // before it (PoD Algorithm 1).
    const std::vector<int>& start = p.pod_block_start[h];
    for (size_t l = 0; l < layers; ++l) {
      const int s = start[l];
      const bool opens = s == static_cast<int>(l);
      const bool continues = l > 0 && s == start[l - 1];
      if (!opens && !continues)
        r.error(fmt::format("pod.block_start[{}][{}]", h, l),
                fmt::format("= {} must be {} (a new block) or the previous layer's block start {}",
                            s, l, l > 0 ? fmt::format("{}", start[l - 1]) : "(none)"));
    }
  }
}

void write_calibration_profile(const CalibrationProfile& profile, const std::string& path) {
  validate_calibration_profile(profile, path);
  std::string text;
  write_pretty(calibration_profile_to_json(profile), 0, text);
  text += "\n";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  PROTOKV_CHECK(out.good(), "cannot write the calibration profile {}", path);
  out << text;
  out.close();
  PROTOKV_CHECK(out.good(), "cannot write the calibration profile {}", path);
}

CalibrationProfile read_calibration_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PROTOKV_CHECK(in.good() && !std::filesystem::is_directory(path),
                "cannot read the calibration profile {}", path);
  // A regular file of bounded size: /dev/zero or a pipe would be read without end.
  std::error_code ec;
  PROTOKV_CHECK(std::filesystem::is_regular_file(path, ec),
                "calibration profile {} is not a regular file", path);
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  PROTOKV_CHECK(!ec && bytes <= limits::kMaxTextFileBytes,
                "calibration profile {} is larger than {} bytes (not a profile)", path,
                limits::kMaxTextFileBytes);
  std::ostringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::parse_error& e) {
    // The byte offset says where (a truncated file ends early); nlohmann's message is one line.
    fail("calibration profile {}: not valid JSON at byte {} (truncated or not a profile)", path,
         e.byte);
  }
  return calibration_profile_from_json(j, path);
}

const CalibrationProfile* profile_option(OptionReader& options,
                                         std::initializer_list<const char*> decided) {
  const std::string path = options.get_text("profile");
  if (path.empty()) return nullptr;
  for (const char* key : decided)
    options.reject_if_given(key, "profile= (the calibration profile decides it)");
  return &load_profile_cached(path);
}

const CalibrationProfile& load_profile_cached(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<const CalibrationProfile>> cache;
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(path, ec);
  const std::string key = ec ? path : canonical.string();
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache
             .emplace(key,
                      std::make_unique<const CalibrationProfile>(read_calibration_profile(path)))
             .first;
  return *it->second;
}

void check_profile_matches(const CalibrationProfile& profile, const SequenceInfo& info,
                           const std::string& press) {
  if (profile.n_layers == info.n_layers && profile.n_heads == info.n_heads &&
      profile.n_kv_heads == info.n_kv_heads && profile.head_dim == info.head_dim)
    return;
  fail(
      "press '{}': the calibration profile is for {} ({}: {} layers, {} heads, {} KV heads, "
      "head_dim {}), not this model ({} layers, {} heads, {} KV heads, head_dim {})",
      press, profile.model_name, profile.model_file, profile.n_layers, profile.n_heads,
      profile.n_kv_heads, profile.head_dim, info.n_layers, info.n_heads, info.n_kv_heads,
      info.head_dim);
}

}  // namespace protokv::press
