// SPDX-License-Identifier: Apache-2.0
// RULER's tasks: the task table, the templates and the sample generators (haystacks, needles,
// variable chains, word lists, QA documents); the scoring is in ruler_scoring.cpp.
#include "eval/ruler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "core/text.h"
#include "eval/longctx_words.h"
#include "eval/niah.h"
#include "protokv/error.h"
#include "protokv/tokenizer.h"

namespace protokv::eval {
namespace {

// Templates + answer prefixes of NVIDIA/RULER scripts/data/synthetic/constants.py (data,
// reproduced verbatim, typo "assgined" included). For base models RULER's prompt is the
// template followed by the answer prefix.
constexpr const char* kNiahTemplate =
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all "
    "the special magic {type_needle_v} for {query} mentioned in the provided text?";
constexpr const char* kNiahAnswerPrefix =
    " The special magic {type_needle_v} for {query} mentioned in the provided text are";
constexpr const char* kVtTemplate =
    "Memorize and track the chain(s) of variable assignment hidden in the following "
    "text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the "
    "text above.";
constexpr const char* kVtAnswerPrefix =
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assgined the value {query}, they are: ";
constexpr const char* kCweTemplate =
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common "
    "words in the above list?";
constexpr const char* kCweAnswerPrefix =
    " Answer: The top 10 words that appear most often in the list are:";
constexpr const char* kFweTemplate =
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
    "Please ignore the dots '....'. What are the three most frequently appeared words in the "
    "above coded text?";
constexpr const char* kFweAnswerPrefix =
    " Answer: According to the coded text above, the three most frequently appeared words are:";
constexpr const char* kQaTemplate =
    "Answer the question based on the given documents. Only give me the answer and do not "
    "output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the "
    "question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nQuestion: {query}";
constexpr const char* kQaAnswerPrefix = " Answer:";
// niah.py's needle sentence.
constexpr const char* kRulerNeedle =
    "One of the special magic {type_needle_v} for {key} is: {value}.";
// variable_tracking.py's noise line.
constexpr const char* kVtNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n";

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

// A prompt split at the context's end: `before` + context is compressed first in
// query-agnostic mode, `after` (question + answer prefix) follows.
struct Built {
  std::string context;  // template text before {context}, and the context
  std::string question;
  std::vector<std::string> answers;
};

Built split_template(const std::string& full_template, const std::string& context,
                     const std::map<std::string, std::string>& fields) {
  const size_t at = full_template.find("{context}");
  std::string before = full_template.substr(0, at);
  std::string after = full_template.substr(at + 9);
  for (const auto& [key, value] : fields) {
    const std::string placeholder = fmt::format("{{{}}}", key);
    before = text::replace_all(before, placeholder, value);
    after = text::replace_all(after, placeholder, value);
  }
  return {before + context, after, {}};
}

struct NiahTask {
  std::string haystack;  // repeat | essay | needle
  std::string type_k, type_v;
  int num_k = 1, num_v = 1, num_q = 1;
};

const std::map<std::string, NiahTask>& niah_tasks() {
  // scripts/synthetic.yaml
  static const std::map<std::string, NiahTask> tasks = {
      {"niah_single_1", {"repeat", "words", "numbers", 1, 1, 1}},
      {"niah_single_2", {"essay", "words", "numbers", 1, 1, 1}},
      {"niah_single_3", {"essay", "words", "uuids", 1, 1, 1}},
      {"niah_multikey_1", {"essay", "words", "numbers", 4, 1, 1}},
      {"niah_multikey_2", {"needle", "words", "numbers", 1, 1, 1}},
      {"niah_multikey_3", {"needle", "uuids", "uuids", 1, 1, 1}},
      {"niah_multivalue", {"essay", "words", "numbers", 1, 4, 1}},
      {"niah_multiquery", {"essay", "words", "numbers", 1, 1, 4}},
  };
  return tasks;
}

std::string random_of_type(const std::string& type, std::mt19937_64& rng) {
  if (type == "numbers") return random_number_text(rng);
  if (type == "uuids") return random_uuid(rng);
  const auto& keys = adjective_noun_keys();
  return keys[static_cast<size_t>(uniform_int(rng, 0, static_cast<int64_t>(keys.size()) - 1))];
}

// Sentences of an essay text (split after ". "), an approximation of nltk's sent_tokenize.
std::vector<std::string> split_sentences(const std::string& text) {
  std::vector<std::string> sents;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(". ", start);
    if (end == std::string::npos) {
      sents.push_back(text.substr(start));
      break;
    }
    sents.push_back(text.substr(start, end + 1 - start));
    start = end + 2;
  }
  return sents;
}

std::vector<std::string> whitespace_words(const std::string& text) {
  std::vector<std::string> words;
  std::string cur;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      if (!cur.empty()) words.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) words.push_back(cur);
  return words;
}

Built niah_generate(const NiahTask& t, int64_t n, const std::vector<std::string>& essay_words,
                    std::mt19937_64& rng) {
  const int num_k = std::max(t.num_k, t.num_q);  // niah.py: num_needle_k = max(k, q)
  std::vector<std::string> keys, needles;
  std::vector<std::vector<std::string>> values;
  for (int k = 0; k < num_k; ++k) {
    keys.push_back(random_of_type(t.type_k, rng));
    values.emplace_back();
    for (int v = 0; v < t.num_v; ++v) {
      values.back().push_back(random_of_type(t.type_v, rng));
      needles.push_back(text::replace_all(
          text::replace_all(text::replace_all(kRulerNeedle, "{type_needle_v}", t.type_v), "{key}",
                            keys.back()),
          "{value}", values.back().back()));
    }
  }
  portable_shuffle(needles, rng);
  std::string context;
  if (t.haystack == "essay") {
    std::vector<std::string> words(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      words[static_cast<size_t>(i)] = essay_words[static_cast<size_t>(i) % essay_words.size()];
    const std::vector<std::string> sents = split_sentences(join(words, " "));
    // DEPTHS = round(linspace(0, 100, 40)); one distinct depth per needle.
    std::vector<int64_t> positions = {0};
    for (int64_t d : sample_indices(rng, 40, static_cast<int64_t>(needles.size()))) {
      const int64_t depth = std::llround(100.0 * static_cast<double>(d) / 39.0);
      positions.push_back(static_cast<int64_t>(sents.size()) * depth / 100);
    }
    std::sort(positions.begin() + 1, positions.end());
    positions.push_back(static_cast<int64_t>(sents.size()));
    std::vector<std::string> parts;
    for (size_t i = 1; i < positions.size(); ++i) {
      std::vector<std::string> chunk(sents.begin() + positions[i - 1],
                                     sents.begin() + positions[i]);
      parts.push_back(join(chunk, " "));
      if (i - 1 < needles.size()) parts.push_back(needles[i - 1]);
    }
    context = join(parts, " ");
  } else {
    std::vector<std::string> sentences;
    for (int64_t i = 0; i < n; ++i) {
      if (t.haystack == "repeat") {
        sentences.push_back(kRulerNoise);
      } else {  // "needle": distractor needles with random keys and values
        const std::string k = random_of_type(t.type_k, rng), v = random_of_type(t.type_v, rng);
        sentences.push_back(text::replace_all(
            text::replace_all(text::replace_all(kRulerNeedle, "{type_needle_v}", t.type_v), "{key}",
                              k),
            "{value}", v));
      }
    }
    std::vector<int64_t> indexes = sample_indices(rng, n, static_cast<int64_t>(needles.size()));
    std::sort(indexes.rbegin(), indexes.rend());
    for (size_t i = 0; i < indexes.size(); ++i)
      sentences.insert(sentences.begin() + indexes[i], needles[i]);
    context = join(sentences, "\n");
  }
  std::vector<std::string> queries, answers;
  for (int64_t i : sample_indices(rng, num_k, t.num_q)) {
    queries.push_back(keys[static_cast<size_t>(i)]);
    for (const auto& v : values[static_cast<size_t>(i)]) answers.push_back(v);
  }
  std::string query = queries[0];
  if (queries.size() > 1) {
    std::vector<std::string> head(queries.begin(), queries.end() - 1);
    query = join(head, ", ") + ", and " + queries.back();
  }
  std::string templ = std::string(kNiahTemplate) + kNiahAnswerPrefix;
  std::string type_v = t.type_v;
  if (t.num_q * t.num_v == 1) {  // niah.py's singular wording
    templ = text::replace_all(templ, "Some", "A");
    templ = text::replace_all(templ, "are all", "is");
    templ = text::replace_all(templ, "are", "is");
    templ = text::replace_all(templ, "answers", "answer");
    type_v.pop_back();
  }
  Built b = split_template(templ, context, {{"type_needle_v", type_v}, {"query", query}});
  b.answers = answers;
  return b;
}

Built vt_generate(int64_t n, int num_hops, std::mt19937_64& rng) {
  std::set<std::string> seen;
  std::vector<std::string> vars;
  while (static_cast<int>(vars.size()) < num_hops + 1) {
    std::string v;
    for (int i = 0; i < 5; ++i) v += static_cast<char>('A' + uniform_int(rng, 0, 25));
    if (seen.insert(v).second) vars.push_back(v);
  }
  const std::string value = std::to_string(uniform_int(rng, 10000, 99998));
  std::vector<std::string> chain = {fmt::format("VAR {} = {}", vars[0], value)};
  for (int j = 0; j < num_hops; ++j)
    chain.push_back(fmt::format("VAR {} = VAR {} ", vars[static_cast<size_t>(j) + 1],
                                vars[static_cast<size_t>(j)]));
  std::vector<std::string> sentences(static_cast<size_t>(n), kVtNoise);
  std::vector<int64_t> positions =
      sample_indices(rng, n, std::min<int64_t>(n, static_cast<int64_t>(chain.size())));
  std::sort(positions.begin(), positions.end());
  for (size_t j = 0; j < positions.size(); ++j)
    sentences.insert(sentences.begin() + positions[j] + static_cast<int64_t>(j), chain[j]);
  const std::string context = text::replace_all(join(sentences, " "), ". \n", ".\n");
  Built b = split_template(std::string(kVtTemplate) + kVtAnswerPrefix, context,
                           {{"query", value}, {"num_v", std::to_string(num_hops + 1)}});
  b.answers = vars;
  return b;
}

std::vector<std::string> cwe_words() {
  std::set<std::string> all;
  for (auto w : word_nouns()) all.emplace(w);
  for (auto w : word_adjectives()) all.emplace(w);
  for (auto w : word_verbs()) all.emplace(w);
  return {all.begin(), all.end()};
}

// get_example of common_words_extraction.py: the numbered list and its common words.
std::pair<std::string, std::vector<std::string>> cwe_example(int64_t num_words, int common_repeats,
                                                             int uncommon_repeats,
                                                             std::mt19937_64& rng) {
  const std::vector<std::string> words = cwe_words();
  std::vector<std::string> chosen;
  for (int64_t i : sample_indices(rng, static_cast<int64_t>(words.size()), num_words))
    chosen.push_back(words[static_cast<size_t>(i)]);
  const std::vector<std::string> common(chosen.begin(), chosen.begin() + 10);
  std::vector<std::string> list;
  for (int r = 0; r < common_repeats; ++r) list.insert(list.end(), common.begin(), common.end());
  for (int r = 0; r < uncommon_repeats; ++r)
    list.insert(list.end(), chosen.begin() + 10, chosen.end());
  portable_shuffle(list, rng);
  std::vector<std::string> numbered;
  for (size_t i = 0; i < list.size(); ++i)
    numbered.push_back(fmt::format("{}. {}", i + 1, list[i]));
  return {join(numbered, " "), common};
}

Built cwe_generate(int64_t num_words, int64_t length, std::mt19937_64& rng) {
  const std::string templ = std::string(kCweTemplate) + kCweAnswerPrefix;
  const bool small = length < 4096;  // common_words_extraction.py's two regimes
  auto [example_ctx, example_answer] =
      cwe_example(small ? 20 : 40, small ? 3 : 10, small ? 1 : 3, rng);
  auto [ctx, answer] = cwe_example(num_words, small ? 6 : 30, small ? 1 : 3, rng);
  const Built ex = split_template(templ, example_ctx, {{"query", ""}});
  std::vector<std::string> numbered;
  for (size_t i = 0; i < example_answer.size(); ++i)
    numbered.push_back(fmt::format("{}. {}", i + 1, example_answer[i]));
  const std::string example = ex.context + ex.question + " " + join(numbered, " ");
  Built b = split_template(templ, ctx, {{"query", ""}});
  b.context = example + "\n" + b.context;
  b.answers = answer;
  return b;
}

Built fwe_generate(int64_t num_words, int64_t length, double alpha, std::mt19937_64& rng) {
  const int64_t vocab_size = std::max<int64_t>(length / 50, 4);
  std::set<std::string> distinct;
  std::vector<std::string> vocab;
  while (static_cast<int64_t>(vocab.size()) < vocab_size) {
    std::string w;
    for (int i = 0; i < 6; ++i) w += static_cast<char>('a' + uniform_int(rng, 0, 25));
    if (distinct.insert(w).second) vocab.push_back(w);
  }
  std::sort(vocab.begin(), vocab.end());
  portable_shuffle(vocab, rng);
  vocab[0] = "...";  // the top-ranked word is noise
  const double z = riemann_zeta(alpha);
  std::vector<std::string> words;
  for (int64_t k = 1; k <= vocab_size; ++k) {
    const auto count = static_cast<int64_t>(static_cast<double>(num_words) *
                                            std::pow(static_cast<double>(k), -alpha) / z);
    for (int64_t c = 0; c < count; ++c) words.push_back(vocab[static_cast<size_t>(k - 1)]);
  }
  portable_shuffle(words, rng);
  Built b = split_template(std::string(kFweTemplate) + kFweAnswerPrefix, join(words, " "),
                           {{"query", ""}});
  b.answers = {vocab[1], vocab[2], vocab[3]};
  return b;
}

// qa.py generate_input_output: the gold documents, then the question's other paragraphs, then
// random others, up to num_docs; shuffled; "Document {i}:\n{document}" joined by blank lines.
Built qa_generate(const RulerQaData& data, size_t index, int64_t num_docs, std::mt19937_64& rng) {
  const auto& q = data.questions[index % data.questions.size()];
  const auto n_docs = static_cast<int64_t>(data.documents.size());
  num_docs = std::max<int64_t>(num_docs, static_cast<int64_t>(q.gold.size()));
  std::vector<int64_t> chosen = q.gold;
  if (num_docs < n_docs) {
    const int64_t extra = num_docs - static_cast<int64_t>(q.gold.size());
    if (extra > static_cast<int64_t>(q.more.size())) {
      chosen.insert(chosen.end(), q.more.begin(), q.more.end());
      std::set<int64_t> used(chosen.begin(), chosen.end());
      std::vector<int64_t> others;
      for (int64_t i = 0; i < n_docs; ++i)
        if (used.count(i) == 0) others.push_back(i);
      const int64_t need = std::min<int64_t>(num_docs - static_cast<int64_t>(chosen.size()),
                                             static_cast<int64_t>(others.size()));
      for (int64_t k : sample_indices(rng, static_cast<int64_t>(others.size()), need))
        chosen.push_back(others[static_cast<size_t>(k)]);
    } else {
      for (int64_t k : sample_indices(rng, static_cast<int64_t>(q.more.size()), extra))
        chosen.push_back(q.more[static_cast<size_t>(k)]);
    }
  } else {
    chosen.clear();
    for (int64_t i = 0; i < n_docs; ++i) chosen.push_back(i);
  }
  portable_shuffle(chosen, rng);
  std::vector<std::string> parts;
  for (size_t i = 0; i < chosen.size(); ++i)
    parts.push_back(
        fmt::format("Document {}:\n{}", i + 1, data.documents[static_cast<size_t>(chosen[i])]));
  Built b = split_template(std::string(kQaTemplate) + kQaAnswerPrefix, join(parts, "\n\n"),
                           {{"query", q.query}});
  b.answers = q.answers;
  return b;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PROTOKV_CHECK(in.good(), "cannot read QA file {}", path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  PROTOKV_CHECK(!j.is_discarded(), "QA file {} is not valid JSON", path);
  return j;
}

// Sorted distinct documents and their index.
std::map<std::string, int64_t> index_documents(std::vector<std::string>& docs) {
  std::sort(docs.begin(), docs.end());
  docs.erase(std::unique(docs.begin(), docs.end()), docs.end());
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < docs.size(); ++i) index[docs[i]] = static_cast<int64_t>(i);
  return index;
}

// FNV-1a: a task's seed must not depend on the standard library's std::hash.
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

int64_t count_tokens(const Tokenizer& tok, const Built& b) {
  return static_cast<int64_t>(tok.encode(b.context, true).size() +
                              tok.encode(b.question, false).size());
}

// The largest n in [1, n_max] whose prompt fits `budget` tokens (grown by doubling, then
// bisected; the generator is re-seeded for every n so a sample depends only on n).
int64_t fit_size(const Tokenizer& tok, const std::function<Built(int64_t, std::mt19937_64&)>& gen,
                 uint64_t seed, int64_t budget, int64_t n_max) {
  auto fits = [&](int64_t n) {
    std::mt19937_64 rng(seed);
    return count_tokens(tok, gen(n, rng)) <= budget;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= n_max && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, n_max + 1);  // first size known (or assumed) not to fit
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

const std::vector<std::string>& ruler_task_names() {
  static const std::vector<std::string> names = {"niah_single_1",
                                                 "niah_single_2",
                                                 "niah_single_3",
                                                 "niah_multikey_1",
                                                 "niah_multikey_2",
                                                 "niah_multikey_3",
                                                 "niah_multivalue",
                                                 "niah_multiquery",
                                                 "vt",
                                                 "cwe",
                                                 "fwe"};
  return names;
}

int ruler_tokens_to_generate(const std::string& task) {
  if (niah_tasks().count(task) > 0) return 128;
  if (task == "vt") return 30;
  if (task == "cwe") return 120;
  if (task == "fwe") return 50;
  if (task == "qa_1" || task == "qa_2") return 32;
  fail("unknown RULER task '{}' (known: {}, qa_1, qa_2)", task, join(ruler_task_names(), ", "));
}

std::vector<int64_t> default_ruler_lengths(int64_t context_length) {
  if (context_length <= 4096) return {context_length};
  std::vector<int64_t> lengths;
  for (int64_t l = 4096; l <= context_length; l *= 2) lengths.push_back(l);
  return lengths;
}

double riemann_zeta(double s) {
  PROTOKV_CHECK(s > 1.0, "zeta({}) diverges: alpha must be > 1", s);
  // Direct sum to N plus the Euler-Maclaurin tail: error far below 1e-9 for s >= 1.1.
  constexpr int kTerms = 10000;
  double sum = 0.0;
  for (int k = kTerms; k >= 1; --k) sum += std::pow(static_cast<double>(k), -s);
  const double n = kTerms;
  return sum + std::pow(n, 1.0 - s) / (s - 1.0) - 0.5 * std::pow(n, -s) +
         s / 12.0 * std::pow(n, -s - 1.0);
}

RulerQaData read_squad(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  RulerQaData data;
  try {
    for (const auto& article : j.at("data"))
      for (const auto& p : article.at("paragraphs"))
        data.documents.push_back(p.at("context").get<std::string>());
    const auto index = index_documents(data.documents);
    for (const auto& article : j.at("data")) {
      std::vector<int64_t> article_docs;
      for (const auto& p : article.at("paragraphs"))
        article_docs.push_back(index.at(p.at("context").get<std::string>()));
      for (const auto& p : article.at("paragraphs")) {
        const int64_t doc = index.at(p.at("context").get<std::string>());
        for (const auto& qa : p.at("qas")) {
          if (qa.value("is_impossible", false)) continue;
          RulerQaData::Question q;
          q.query = qa.at("question").get<std::string>();
          for (const auto& a : qa.at("answers"))
            q.answers.push_back(a.at("text").get<std::string>());
          if (q.answers.empty()) continue;
          q.gold = {doc};
          for (int64_t d : article_docs)
            if (d != doc) q.more.push_back(d);
          data.questions.push_back(std::move(q));
        }
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not in SQuAD format (data/paragraphs/qas): {}", path, e.what());
  }
  PROTOKV_CHECK(!data.questions.empty(), "{} has no answerable question", path);
  return data;
}

RulerQaData read_hotpotqa(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  RulerQaData data;
  auto doc_text = [](const nlohmann::json& entry) {
    std::string text = entry.at(0).get<std::string>() + "\n";
    for (const auto& sentence : entry.at(1)) text += sentence.get<std::string>();
    return text;
  };
  try {
    PROTOKV_CHECK(j.is_array(), "{} is not a list of HotpotQA questions", path);
    for (const auto& item : j)
      for (const auto& entry : item.at("context")) data.documents.push_back(doc_text(entry));
    const auto index = index_documents(data.documents);
    for (const auto& item : j) {
      RulerQaData::Question q;
      q.query = item.at("question").get<std::string>();
      q.answers = {item.at("answer").get<std::string>()};
      for (const auto& entry : item.at("context")) q.gold.push_back(index.at(doc_text(entry)));
      data.questions.push_back(std::move(q));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not in HotpotQA format (question/answer/context): {}", path, e.what());
  }
  PROTOKV_CHECK(!data.questions.empty(), "{} has no question", path);
  return data;
}

std::vector<LongctxSample> make_ruler_samples(const Tokenizer& tokenizer,
                                              const RulerOptions& options) {
  const std::vector<std::string> tasks = options.tasks.empty() ? ruler_task_names() : options.tasks;
  std::optional<RulerQaData> squad, hotpotqa;
  for (const auto& t : tasks) {
    ruler_tokens_to_generate(t);  // throws for an unknown task
    if (t == "qa_1") {
      PROTOKV_CHECK(!options.squad_path.empty(), "RULER qa_1 needs a SQuAD file");
      squad = read_squad(options.squad_path);
    }
    if (t == "qa_2") {
      PROTOKV_CHECK(!options.hotpotqa_path.empty(), "RULER qa_2 needs a HotpotQA file");
      hotpotqa = read_hotpotqa(options.hotpotqa_path);
    }
  }
  PROTOKV_CHECK(options.samples >= 1, "RULER needs at least 1 sample per task");
  std::vector<std::string> essay_words = whitespace_words(options.essay_text);
  if (essay_words.empty()) essay_words = whitespace_words(kRulerNoise);
  std::vector<LongctxSample> samples;
  for (const auto& task : tasks) {
    const int gen_tokens = ruler_tokens_to_generate(task);
    const bool qa = task == "qa_1" || task == "qa_2";
    const std::string metric = qa ? "string_match_part" : "string_match_all";
    for (int64_t length : options.lengths) {
      const int64_t budget = length - gen_tokens;
      for (int i = 0; i < options.samples; ++i) {
        const uint64_t seed =
            options.seed ^ (fnv1a(task) * 31 + static_cast<uint64_t>(length) * 1000003ULL +
                            static_cast<uint64_t>(i));
        std::function<Built(int64_t, std::mt19937_64&)> gen;
        int64_t n_max = int64_t{1} << 22;
        if (auto it = niah_tasks().find(task); it != niah_tasks().end()) {
          const NiahTask& t = it->second;
          gen = [t, &essay_words](int64_t n, std::mt19937_64& rng) {
            return niah_generate(t, n, essay_words, rng);
          };
        } else if (qa) {
          const RulerQaData& data = task == "qa_1" ? *squad : *hotpotqa;
          n_max = static_cast<int64_t>(data.documents.size());
          const auto index = static_cast<size_t>(i);
          gen = [&data, index](int64_t n, std::mt19937_64& rng) {
            return qa_generate(data, index, n, rng);
          };
        } else if (task == "vt") {
          // One-shot example first (variable_tracking.py's ICL example), at most length / 5.
          auto example_gen = [](int64_t n, std::mt19937_64& rng) { return vt_generate(n, 4, rng); };
          const int64_t n_example =
              std::max<int64_t>(1, fit_size(tokenizer, example_gen, seed + 7, length / 5, 1 << 16));
          std::mt19937_64 example_rng(seed + 7);
          const Built ex = vt_generate(n_example, 4, example_rng);
          const std::string example =
              ex.context + ex.question + " " + join(ex.answers, " ") + "\n\n";
          gen = [example](int64_t n, std::mt19937_64& rng) {
            Built b = vt_generate(n, 4, rng);
            b.context = example + b.context;
            return b;
          };
        } else if (task == "cwe") {
          n_max = static_cast<int64_t>(cwe_words().size());
          gen = [length](int64_t n, std::mt19937_64& rng) {
            return cwe_generate(std::max<int64_t>(n, 11), length, rng);
          };
        } else {  // fwe, alpha 2 (synthetic.yaml)
          gen = [length](int64_t n, std::mt19937_64& rng) {
            return fwe_generate(n, length, 2.0, rng);
          };
        }
        LongctxSample sample;
        sample.id = fmt::format("{}_L{}_{}", task, length, i);
        sample.max_new_tokens = gen_tokens;
        sample.meta = {{"task", task}, {"length", length}, {"metric", metric}};
        const int64_t n = fit_size(tokenizer, gen, seed, budget, n_max);
        if (n == 0) {
          sample.error = fmt::format("length {} is too short for task {}", length, task);
          samples.push_back(std::move(sample));
          continue;
        }
        std::mt19937_64 rng(seed);
        const Built b = gen(n, rng);
        sample.context = tokenizer.encode(b.context, true);
        sample.question = tokenizer.encode(b.question, false);
        sample.answers = b.answers;
        sample.meta["haystack_size"] = n;
        samples.push_back(std::move(sample));
      }
    }
  }
  return samples;
}

}  // namespace protokv::eval
