// SPDX-License-Identifier: Apache-2.0
// Evaluation datasets: LongBench JSONL (read_longbench_jsonl, then every official metric on the
// parsed answers) and RULER's QA sources (SQuAD and HotpotQA JSON). Byte 0 picks the reader
// ('S' SQuAD, 'H' HotpotQA, anything else LongBench); the rest is the file.
#include <set>

#include "eval/longbench.h"
#include "eval/ruler.h"
#include "fuzz_target.h"

namespace protokv::fuzz {
namespace {

// A prediction is at most max_new_tokens tokens (<= 512 in LongBench): a few KiB of text.
constexpr size_t kMaxPredictionBytes = 2048;

Outcome run(Bytes data) {
  if (data.empty()) return Outcome::kRefused;
  const MemoryFile file(data.subspan(1));
  return accept_or_refuse([&] {
    if (data[0] == 'S' || data[0] == 'H') {
      const eval::RulerQaData qa =
          data[0] == 'S' ? eval::read_squad(file.path()) : eval::read_hotpotqa(file.path());
      for (const auto& question : qa.questions) {
        for (const int64_t doc : question.gold)
          if (doc < 0 || doc >= static_cast<int64_t>(qa.documents.size()))
            finding("a gold document index outside the documents");
        const std::string prediction = question.query.substr(0, kMaxPredictionBytes);
        (void)eval::string_match_all(prediction, question.answers);
        (void)eval::string_match_part(prediction, question.answers);
      }
      return;
    }
    std::set<std::string> metrics;
    for (const auto& dataset : eval::longbench_datasets()) metrics.insert(dataset.metric);
    for (const eval::LongbenchExample& example : eval::read_longbench_jsonl(file.path())) {
      if (!example.error.empty()) {
        check_error_message(example.error);
        continue;
      }
      (void)eval::longbench_bucket(example.length);
      const std::string prediction = example.input.substr(0, kMaxPredictionBytes);
      for (const std::string& answer : example.answers)
        for (const std::string& metric : metrics)
          (void)eval::longbench_metric(metric, prediction, answer, example.all_classes);
    }
  });
}

void write_seeds(const std::filesystem::path& dir, const std::filesystem::path&) {
  const std::filesystem::path fixtures =
      std::filesystem::path(PROTOKV_SOURCE_DIR) / "tests" / "data" / "longbench";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(fixtures))
    if (entry.path().extension() == ".jsonl") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& path : files)
    write_seed(dir, "longbench-" + path.stem().string(),
               std::string("L").append(read_file_bytes(path)));
  // RULER's QA sources in their official layouts (tests/test_eval_ruler.cpp's fixtures).
  write_seed(dir, "squad", R"(S{"data": [{"title": "t", "paragraphs": [
      {"context": "The river Alba flows to the sea.", "qas": [
        {"question": "Where does the Alba flow?", "answers": [{"text": "to the sea"}],
         "is_impossible": false},
        {"question": "Unanswerable?", "answers": [], "is_impossible": true}]},
      {"context": "Bread is baked at dawn.", "qas": []}]},
      {"title": "u", "paragraphs": [{"context": "Owls hunt at night.", "qas": [
        {"question": "When do owls hunt?", "answers": [{"text": "at night"}]}]}]}]})");
  write_seed(dir, "hotpotqa", R"(H[{"question": "Which is older?", "answer": "Rome",
      "context": [["Rome", ["Rome is old.", " Very old."]], ["Paris", ["Paris is younger."]]]}])");
}

}  // namespace

extern const Target kDatasets = {
    "datasets", "a LongBench JSONL file or RULER's SQuAD / HotpotQA JSON", run, write_seeds};

}  // namespace protokv::fuzz
