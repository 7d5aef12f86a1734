// SPDX-License-Identifier: Apache-2.0
#pragma once
// LongBench / LongBench-E (Bai et al. 2023, THUDM/LongBench): official JSONL data, per-dataset
// prompt templates (config/dataset2prompt.json) and generation limits (config/
// dataset2maxlen.json), middle truncation to --max-length tokens (pred.py), and the official
// metrics (metrics.py, scorer / scorer_e of eval.py). Reproduced from the definitions; where
// C++ cannot match the Python exactly, the difference is stated at the function.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/longctx_runner.h"

namespace protokv {
class Tokenizer;
}

namespace protokv::eval {

struct LongbenchDataset {
  std::string name;
  std::string prompt;  // with {context} and {input}
  int max_new_tokens = 32;
  std::string metric;         // qa_f1, qa_f1_zh, rouge, rouge_zh, classification, retrieval,
                              // retrieval_zh, count, code_sim
  bool chat_template = true;  // pred.py skips it for trec, triviaqa, samsum, lsht, lcc, repobench-p
  bool first_line_only = false;  // eval.py keeps the first line for trec, triviaqa, samsum, lsht
};

// The 21 LongBench datasets in the official order.
const std::vector<LongbenchDataset>& longbench_datasets();
// Throws Error naming the known datasets for an unknown name.
const LongbenchDataset& find_longbench_dataset(const std::string& name);

struct LongbenchExample {
  std::string id;  // _id (or "line N" when absent)
  std::string input, context;
  std::vector<std::string> answers;
  std::vector<std::string> all_classes;
  int64_t length = 0;  // the file's "length" field (words / characters), for LongBench-E buckets
  int64_t line = 0;
  std::string error;  // non-empty: the line is malformed (reported and skipped)
};

// Reads one official JSONL file. A malformed line or one missing a required field (input,
// context, answers) becomes an example with `error` set; a missing/unreadable file throws.
std::vector<LongbenchExample> read_longbench_jsonl(const std::string& path);

// LongBench-E length bucket of eval.py's scorer_e: "0-4k" (< 4000), "4-8k" (< 8000), "8k+".
std::string longbench_bucket(int64_t length);

// The text put before and after the plain prompt for chat models, as pred.py's build_chat does:
// for datasets with chat_template = true and a tokenizer that carries a chat template (an
// instruct model), the prompt becomes the user turn of that template, followed by the header of
// the assistant's turn. Empty (plain prompt) otherwise.
struct ChatWrap {
  std::string prefix, suffix;
};
ChatWrap longbench_chat_wrap(const LongbenchDataset& dataset, const Tokenizer& tokenizer);

// The sample of one example: prompt = template with {context} and {input}; context part = the
// template up to the end of {context} (compressed first in query-agnostic mode), question part
// = the rest. When the prompt exceeds `max_length` tokens (> 0), the middle is cut as pred.py
// does (first max_length/2 and last max_length/2 tokens kept; done on tokens rather than by
// decoding and re-encoding). `max_length` = 0: no truncation, and a prompt that does not fit
// `context_length` with its new tokens throws Error (the user must pass --max-length).
LongctxSample make_longbench_sample(const Tokenizer& tokenizer, const LongbenchDataset& dataset,
                                    const LongbenchExample& example, int64_t max_length,
                                    int64_t context_length);

// Official metrics, one (prediction, ground truth) pair, in [0, 1].
double qa_f1_score(const std::string& prediction, const std::string& truth);
// Approximation: jieba word segmentation is replaced by one token per CJK/non-ASCII character
// and per ASCII alphanumeric run; equal to the official where jieba splits into single
// characters.
double qa_f1_zh_score(const std::string& prediction, const std::string& truth);
// ROUGE-L F of the `rouge` package LongBench uses (summary-level, sentences split at '.',
// word sets: rouge_score.rouge_l_summary_level with exclusive=True).
double rouge_score(const std::string& prediction, const std::string& truth);
// rouge_score over segmented text (same approximation of jieba as qa_f1_zh).
double rouge_zh_score(const std::string& prediction, const std::string& truth);
// metrics.py's classification_score, including its list-removal-while-iterating behaviour.
double classification_score(const std::string& prediction, const std::string& truth,
                            const std::vector<std::string>& all_classes);
double retrieval_score(const std::string& prediction, const std::string& truth);
double retrieval_zh_score(const std::string& prediction, const std::string& truth);
double count_score(const std::string& prediction, const std::string& truth);
// fuzz.ratio / 100 on the first line without ` # //: round(100 * 2 * LCS / (|a| + |b|)) / 100
// over code points, which is python-Levenshtein's ratio (fuzzywuzzy's fast path); fuzzywuzzy's
// difflib fallback can find fewer matches on some strings.
double code_sim_score(const std::string& prediction, const std::string& truth);

double longbench_metric(const std::string& metric, const std::string& prediction,
                        const std::string& truth, const std::vector<std::string>& all_classes);
// eval.py's per-sample score: first-line post-processing where the dataset asks for it, then the
// maximum over the answers.
double longbench_score(const LongctxSample& sample, const std::string& prediction);

}  // namespace protokv::eval
