// SPDX-License-Identifier: Apache-2.0
#pragma once
// `protokv calibrate` as a library: runs calibration sequences through the FULL cache and measures
// what chelsea and pod need (press/calibration_profile.h), with the measure functions of
// press/calibration_measures.h.
//
// Capture. Each sequence of T tokens is prefilled up to T - R tokens and its last R tokens are
// decoded one at a time (teacher-forced) with a DecodeObserver that asks for the attention
// weights. That gives, at every layer, the attention rows of the last R queries per query head
// (the engine's own softmax, over every earlier position: a causal row of prefill attention is
// exactly the decode attention of the same token over the same cache) and, once the sequence is
// in, the post-RoPE keys of all T tokens per KV head in the full cache. No engine hook was added
// for this: the cache already holds the keys, and DecodeObserver already hands out attention
// weights, whereas a prefill observer (or a press that captures without compressing) would be a
// second way into prefill for one command.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "press/calibration_measures.h"
#include "press/calibration_profile.h"
#include "protokv/model.h"

namespace protokv::eval {

// What one sequence's full-cache run exposes.
struct CalibrationCapture {
  int64_t tokens = 0;  // T
  int64_t rows = 0;    // R: the last R queries
  // [layer][kv_head]: post-RoPE keys of positions 0..T-1, [T, head_dim].
  std::vector<std::vector<std::vector<float>>> keys;
  // [layer][q_head]: attention weights of queries T-R..T-1, [R, T]; row r covers positions
  // 0..T-R+r and is zero beyond (the causal mask's weight).
  std::vector<std::vector<std::vector<float>>> attention;
};

// Runs `tokens` through a full-cache session of `weights` and captures the last `rows` queries'
// attention. Throws Error unless 1 <= rows < tokens.size() <= context.
CalibrationCapture capture_calibration_sequence(const ModelWeights& weights,
                                                std::span<const int32_t> tokens, int64_t rows);

struct CalibrationOptions {
  double chelsea_threshold = 0.8;  // cosine similarity a link needs (Chelsea §5)
  double outlier_fraction = 0.04;  // share of heads kept full (Chelsea §5)
  press::ChelseaLayout chelsea_layout;
  double pod_delta = 0.5;  // grouping threshold on 1 - JS similarity (PoD Algorithm 1)
  int64_t pod_rows = 32;   // last queries whose attention rows are compared
};

// Throws Error for a value out of range (threshold outside [-1, 1], fraction or delta outside
// [0, 1], rows < 1).
void validate_calibration_options(const CalibrationOptions& options);

// Per-sequence measures, then their means over the sequences:
//  - chelsea_unlinked_share[l][h] = chelsea_unlinked_share(keys[l][h]) (the mean over sequences of
//    equal length equals the share over all their links), chelsea_outlier from the mean;
//  - pod_similarity[h][i * L + j] = the mean over sequences and over the query heads of KV head h
//    of attention_similarity(attention[i][q], attention[j][q]) over the R rows (the T columns,
//    zero-padded causal rows: zeros add nothing to a JS divergence); pod_block_start from it.
// The identity and source fields are left for the caller. `progress` (optional) is called after
// each sequence with (done, total).
press::CalibrationProfile calibrate(const ModelWeights& weights,
                                    const std::vector<std::vector<int32_t>>& sequences,
                                    const CalibrationOptions& options,
                                    const std::function<void(size_t, size_t)>& progress = {});

// The measures of one captured sequence, as calibrate() computes them before averaging.
std::vector<std::vector<float>> unlinked_shares(const CalibrationCapture& capture, int head_dim,
                                                const CalibrationOptions& options);
std::vector<std::vector<double>> pod_similarities(const CalibrationCapture& capture,
                                                  int n_kv_heads);

// Key bytes (F32) per distant token that PoD's grouping would not store: one key per (layer,
// KV head) whose layer shares its block's first layer's keys.
int64_t pod_shared_key_bytes_per_token(const press::CalibrationProfile& profile);

// The command's summary lines: outlier heads, blocks per KV head, key bytes PoD would save.
std::string calibration_summary(const press::CalibrationProfile& profile);

}  // namespace protokv::eval
