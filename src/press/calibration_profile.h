// SPDX-License-Identifier: Apache-2.0
#pragma once
// A calibration profile (`protokv calibrate`, DESIGN §5 chelsea and pod): what a model's
// calibration run measured, per model, for the presses to read with `profile=FILE` instead of
// calibrating on the prompt itself.
//  - chelsea: per (layer, KV head) the share of A entries without a soft-matching link of cosine
//    similarity >= threshold (calibration_measures.h chelsea_unlinked_share), and the outlier
//    heads (the top `fraction` of them, chelsea_outlier_heads) that keep the full cache;
//  - pod: per KV head the layer-by-layer attention similarity (mean over rows of 1 - JS in bits,
//    attention_similarity) and the layer blocks PoD Algorithm 1 groups at delta
//    (pod_block_starts).
// The JSON form is versioned; reading it validates every field and its shape against the model
// identity it records, and throws Error with one line naming the file and the field.
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "press/calibration_measures.h"
#include "protokv/press.h"
#include "protokv/press/options.h"

namespace protokv::press {

inline constexpr const char* kCalibrationProfileFormat = "protokv-calibration-profile";
inline constexpr int kCalibrationProfileVersion = 1;

struct CalibrationProfile {
  int version = kCalibrationProfileVersion;

  // The model it was made for: the presses refuse a profile of another shape
  // (check_profile_matches); the names are recorded for people.
  std::string model_file;  // file name, without its directory
  std::string model_name;  // general.name, or the architecture when the file has none
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;

  // Where the calibration text came from: "file" (`source_name` is the file name) or "model"
  // (the model's own samples from BOS; `source_name` says how they were drawn).
  std::string source_kind;
  std::string source_name;
  int64_t samples = 0;  // sequences run through the full cache
  int64_t tokens = 0;   // tokens per sequence (BOS included)

  // Chelsea (§5).
  double chelsea_threshold = 0.8;
  double chelsea_fraction = 0.04;
  ChelseaLayout chelsea_layout;
  std::vector<std::vector<float>> chelsea_unlinked_share;  // [layer][kv_head] in [0, 1]
  std::vector<std::vector<uint8_t>> chelsea_outlier;       // [layer][kv_head] 0 or 1

  // PoD (§3, Algorithm 1).
  double pod_delta = 0.5;
  int64_t pod_rows = 32;  // attention rows of the last queries compared per layer pair
  // [kv_head][i * n_layers + j]: similarity of layers i and j, symmetric, 1 on the diagonal.
  std::vector<std::vector<double>> pod_similarity;
  std::vector<std::vector<int>> pod_block_start;  // [kv_head][layer]: lowest layer of its block
};

// The profile as JSON (format, version, model, source, chelsea, pod sections, in that order).
nlohmann::ordered_json calibration_profile_to_json(const CalibrationProfile& profile);
// Reads and validates `json`; `origin` (e.g. the file path) starts every error message. Throws
// Error for a wrong format or version, a missing or unknown field, a wrong shape, or a value out
// of range (shares outside [0, 1], outlier flags other than 0/1, similarities outside [0, 1],
// block starts above their layer or not contiguous).
CalibrationProfile calibration_profile_from_json(const nlohmann::json& json,
                                                 const std::string& origin);
// Throws Error when the profile is inconsistent (as calibration_profile_from_json checks).
void validate_calibration_profile(const CalibrationProfile& profile, const std::string& origin);

// Writes the profile (validated first) as indented JSON. Throws Error when the file cannot be
// written.
void write_calibration_profile(const CalibrationProfile& profile, const std::string& path);
// Reads and validates a profile file. Throws Error when it cannot be read, is not JSON (a
// truncated file included) or fails validation.
CalibrationProfile read_calibration_profile(const std::string& path);
// read_calibration_profile once per path in this process (presses built per session share it).
const CalibrationProfile& load_profile_cached(const std::string& path);

// The `profile=FILE` option of a press that reads a calibration profile (load_profile_cached):
// null when the option is not given. With a profile, the options in `decided` (what the profile
// already settled, e.g. a threshold) are errors. Throws Error as read_calibration_profile does.
const CalibrationProfile* profile_option(OptionReader& options,
                                         std::initializer_list<const char*> decided);

// Throws Error unless the profile was made for a model of this shape (layers, query heads, KV
// heads, head_dim); `press` names the method in the message.
void check_profile_matches(const CalibrationProfile& profile, const SequenceInfo& info,
                           const std::string& press);

}  // namespace protokv::press
