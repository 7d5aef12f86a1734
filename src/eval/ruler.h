// SPDX-License-Identifier: Apache-2.0
#pragma once
// RULER (Hsieh et al. 2024, NVIDIA/RULER): synthetic long-context tasks with their templates,
// generators and scoring. Task definitions follow scripts/synthetic.yaml; templates and answer
// prefixes scripts/data/synthetic/constants.py; generators niah.py, variable_tracking.py,
// common_words_extraction.py, freq_words_extraction.py; scoring scripts/eval/synthetic/
// constants.py (string_match_all for niah/vt/cwe/fwe, string_match_part for qa), x100.
//
// Differences from the original, all recorded in config.json:
//  - random draws use a seeded std::mt19937_64, so the samples are not the original's;
//  - word lists are short hand-written lists (eval/longctx_words.h), not `wonderwords`;
//  - the "essay" haystack (Paul Graham essays) is --haystack FILE when given, split into
//    sentences at ". "; without it, RULER's repeated-noise sentences stand in;
//  - the prompt is tokenized as context part (BOS + template up to the context) and question
//    part (the rest, answer prefix included), encoded separately like every protokv benchmark;
//  - the sample length is fitted exactly by binary search on the haystack size (the original
//    grows it in steps);
//  - qa_1/qa_2 documents are drawn with the seeded generator, like the others;
//  - variable tracking's one-shot example uses the full template and at most a fifth of the
//    length (the original's example is up to 500 tokens and trims the template).
#include <cstdint>
#include <string>
#include <vector>

#include "eval/longctx_runner.h"

namespace protokv {
class Tokenizer;
}

namespace protokv::eval {

// niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, niah_multiquery, vt, cwe, fwe, and
// qa_1 / qa_2 (which need --squad / --hotpotqa files).
const std::vector<std::string>& ruler_task_names();
// Tokens generated per task (constants.py tokens_to_generate).
int ruler_tokens_to_generate(const std::string& task);

struct RulerOptions {
  std::vector<std::string> tasks;  // empty: the eleven synthetic tasks
  std::vector<int64_t> lengths;    // prompt + generated tokens, as RULER's max_seq_length
  int samples = 4;                 // per task and length
  uint64_t seed = 42;
  std::string essay_text;     // haystack for "essay" tasks; empty: repeated noise
  std::string squad_path;     // SQuAD JSON (v2.0 dev format) for qa_1
  std::string hotpotqa_path;  // HotpotQA JSON (distractor dev format) for qa_2
};

// RULER's QA data (scripts/data/synthetic/qa.py): distinct documents (sorted) and the questions,
// each with its answers, its gold documents and (SQuAD) the other paragraphs of its article.
struct RulerQaData {
  struct Question {
    std::string query;
    std::vector<std::string> answers;
    std::vector<int64_t> gold;
    std::vector<int64_t> more;
  };
  std::vector<std::string> documents;
  std::vector<Question> questions;
};
// Throws Error for an unreadable file or one not in the expected format.
RulerQaData read_squad(const std::string& path);
RulerQaData read_hotpotqa(const std::string& path);

// Default lengths: RULER's 4096, 8192, ... up to the context; the context itself below 4096.
std::vector<int64_t> default_ruler_lengths(int64_t context_length);

// Every sample of every task and length. Throws Error for an unknown task.
std::vector<LongctxSample> make_ruler_samples(const Tokenizer& tokenizer,
                                              const RulerOptions& options);

// RULER's metrics on one prediction: share of references contained (case-insensitive) / 1 when
// any is.
double string_match_all(const std::string& prediction, const std::vector<std::string>& refs);
double string_match_part(const std::string& prediction, const std::vector<std::string>& refs);
// The task's metric (meta["metric"]).
double ruler_score(const LongctxSample& sample, const std::string& prediction);

// Riemann zeta(s) for s > 1 (fwe's word counts).
double riemann_zeta(double s);

}  // namespace protokv::eval
