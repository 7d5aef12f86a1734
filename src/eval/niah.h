// SPDX-License-Identifier: Apache-2.0
#pragma once
// Needle in a haystack (Kamradt, LLMTest_NeedleInAHaystack): a fact ("needle") is hidden at a
// given depth of filler text ("haystack") of a given length; the model is asked for it and is
// right when its greedy answer contains the needle's value. A grid of lengths x depths, one cell
// per pair, is drawn as a heat map per (press, budget), as in the papers' figures.
//
// Layout of a cell's prompt (token level, so the length is exact):
//   BOS, haystack[0, i), needle, haystack[i, n), question
// where n haystack tokens fill the prompt to exactly `length` tokens and i = floor(n * depth /
// 100), moved back to just after the last haystack token ending a sentence ('.'), as the
// original does; depth 100 puts the needle at the very end.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/longctx_runner.h"

namespace protokv {
class Tokenizer;
}

namespace protokv::eval {

// RULER's repeated-noise haystack sentence (scripts/data/synthetic/niah.py, type_haystack
// "repeat"; repeated and joined with '\n').
inline constexpr const char* kRulerNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

struct NiahOptions {
  std::vector<int64_t> lengths;  // prompt tokens (BOS + haystack + needle + question)
  std::vector<double> depths;    // percent of the haystack before the needle, in [0, 100]
  // {key} and {value} are replaced. Defaults in the style of the original test.
  std::string needle = "The special magic number for {key} is {value}.";
  std::string question =
      "\nWhat is the special magic number for {key}? The special magic number for {key} is";
  int max_new_tokens = 16;
  int samples_per_cell = 1;  // different key/value per sample, same haystack
  uint64_t seed = 42;
};

// A needle or question template with {key} and {value} replaced.
std::string fill_niah_template(const std::string& templ, const std::string& key,
                               const std::string& value);

// Default lengths: geometric from min(512, hi / 4) to hi = context - max_new_tokens, in 4 to 8
// steps (one per doubling, at least 4), rounded to integers.
std::vector<int64_t> default_niah_lengths(int64_t context_length, int max_new_tokens);
// 0, 10, ..., 100.
std::vector<double> default_niah_depths();

// The haystack as tokens (no BOS), at least `min_tokens` long: `text` tokenized and repeated
// (joined by a space). Throws Error when text is empty/whitespace or not valid UTF-8, naming
// `what` (e.g. the file path).
std::vector<int32_t> haystack_from_text(const Tokenizer& tokenizer, const std::string& text,
                                        int64_t min_tokens, const std::string& what);
// RULER's repeated noise sentences joined by '\n'.
std::vector<int32_t> haystack_noise(const Tokenizer& tokenizer, int64_t min_tokens);

// One sample per (length, depth, sample). A cell too short for needle + question gets a sample
// with `error` set (recorded as skipped).
std::vector<LongctxSample> make_niah_samples(const Tokenizer& tokenizer,
                                             const std::vector<int32_t>& haystack,
                                             const NiahOptions& options);

// Exact containment of the needle's value (answers[0]) in the prediction.
double niah_score(const LongctxSample& sample, const std::string& prediction);

// Accuracy per (length, depth) of one run: [length index][depth index], NaN where nothing scored.
std::vector<std::vector<double>> niah_grid(const std::vector<LongctxRecord>& records,
                                           const std::string& run, const NiahOptions& options);

// Heat map SVG (x: length, y: depth from 0% at the top, colour: accuracy red -> green), one
// value per cell written inside it, as in the papers' figures.
std::string render_niah_heatmap(const std::vector<std::vector<double>>& grid,
                                const NiahOptions& options, const std::string& title);

}  // namespace protokv::eval
