// SPDX-License-Identifier: Apache-2.0
#include "eval/longbench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>

#include "core/text.h"
#include "protokv/error.h"
#include "protokv/tokenizer.h"

namespace protokv::eval {

const std::vector<LongbenchDataset>& longbench_datasets() {
  // Prompts: THUDM/LongBench config/dataset2prompt.json; max new tokens: config/
  // dataset2maxlen.json; metrics: eval.py dataset2metric; chat / first-line lists: pred.py and
  // eval.py. Data reproduced verbatim.
  static const std::vector<LongbenchDataset> datasets = {
      {"narrativeqa",
       "You are given a story, which can be either a novel or a movie script, and a question. "
       "Answer the question as concisely as you can, using a single phrase if possible. Do not "
       "provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the "
       "story as concisely as you can, using a single phrase if possible. Do not provide any "
       "explanation.\n\nQuestion: {input}\n\nAnswer:",
       128, "qa_f1", true, false},
      {"qasper",
       "You are given a scientific article and a question. Answer the question as concisely as "
       "you can, using a single phrase or sentence if possible. If the question cannot be "
       "answered based on the information in the article, write \"unanswerable\". If the "
       "question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not "
       "provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the "
       "above article as concisely as you can, using a single phrase or sentence if possible. If "
       "the question cannot be answered based on the information in the article, write "
       "\"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or "
       "\"unanswerable\". Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",
       128, "qa_f1", true, false},
      {"multifieldqa_en",
       "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following "
       "question based on the above text, only give me the answer and do not output any other "
       "words.\n\nQuestion: {input}\nAnswer:",
       64, "qa_f1", true, false},
      {"multifieldqa_zh",
       "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，"
       "只告诉我答案，不要输出任何其他字词。\n\n问题：{input}\n回答：",
       64, "qa_f1_zh", true, false},
      {"hotpotqa",
       "Answer the question based on the given passages. Only give me the answer and do not "
       "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
       "question based on the given passages. Only give me the answer and do not output any "
       "other words.\n\nQuestion: {input}\nAnswer:",
       32, "qa_f1", true, false},
      {"2wikimqa",
       "Answer the question based on the given passages. Only give me the answer and do not "
       "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
       "question based on the given passages. Only give me the answer and do not output any "
       "other words.\n\nQuestion: {input}\nAnswer:",
       32, "qa_f1", true, false},
      {"musique",
       "Answer the question based on the given passages. Only give me the answer and do not "
       "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
       "question based on the given passages. Only give me the answer and do not output any "
       "other words.\n\nQuestion: {input}\nAnswer:",
       32, "qa_f1", true, false},
      {"dureader",
       "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。"
       "\n\n问题：{input}\n回答：",
       128, "rouge_zh", true, false},
      {"gov_report",
       "You are given a report by a government agency. Write a one-page summary of the "
       "report.\n\nReport:\n{context}\n\nNow, write a one-page summary of the "
       "report.\n\nSummary:",
       512, "rouge", true, false},
      {"qmsum",
       "You are given a meeting transcript and a query containing a question or instruction. "
       "Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the "
       "query based on the above meeting transcript in one or more sentences.\n\nQuery: "
       "{input}\nAnswer:",
       512, "rouge", true, false},
      {"multi_news",
       "You are given several news passages. Write a one-page summary of all news. "
       "\n\nNews:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",
       512, "rouge", true, false},
      {"vcsum",
       "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}"
       "\n\n会议总结：",
       512, "rouge_zh", true, false},
      {"trec",
       "Please determine the type of the question below. Here are some examples of "
       "questions.\n\n{context}\n{input}",
       64, "classification", false, true},
      {"triviaqa",
       "Answer the question based on the given passage. Only give me the answer and do not "
       "output any other words. The following are some examples.\n\n{context}\n\n{input}",
       32, "qa_f1", false, true},
      {"samsum",
       "Summarize the dialogue into a few short sentences. The following are some "
       "examples.\n\n{context}\n\n{input}",
       128, "rouge", false, true},
      {"lsht", "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}", 64, "classification",
       false, true},
      {"passage_count",
       "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. "
       "Please carefully read these paragraphs and determine how many unique paragraphs there "
       "are after removing duplicates. In other words, how many non-repeating paragraphs are "
       "there in total?\n\n{context}\n\nPlease enter the final count of unique paragraphs after "
       "removing duplicates. The output format should only contain the number, such as 1, 2, 3, "
       "and so on.\n\nThe final answer is: ",
       32, "count", true, false},
      {"passage_retrieval_en",
       "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which "
       "paragraph the abstract is from.\n\n{context}\n\nThe following is an "
       "abstract.\n\n{input}\n\nPlease enter the number of the paragraph that the abstract is "
       "from. The answer format must be like \"Paragraph 1\", \"Paragraph 2\", etc.\n\nThe "
       "answer is: ",
       32, "retrieval", true, false},
      {"passage_retrieval_zh",
       "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}"
       "\n\n下面是一个摘要\n\n{input}\n\n请输入摘要所属段落的编号。答案格式必须是\"段落1\"，"
       "\"段落2\"等格式\n\n答案是：",
       32, "retrieval_zh", true, false},
      {"lcc", "Please complete the code given below. \n{context}Next line of code:\n", 64,
       "code_sim", false, false},
      {"repobench-p",
       "Please complete the code given below. \n{context}{input}Next line of code:\n", 64,
       "code_sim", false, false},
  };
  return datasets;
}

const LongbenchDataset& find_longbench_dataset(const std::string& name) {
  std::string known;
  for (const auto& d : longbench_datasets()) {
    if (d.name == name) return d;
    known += (known.empty() ? "" : ", ") + d.name;
  }
  fail("unknown LongBench dataset '{}' (known: {})", name, known);
}

namespace {

std::vector<std::string> string_list(const nlohmann::json& j, const char* field) {
  std::vector<std::string> out;
  if (!j.contains(field) || j[field].is_null()) return out;
  PROTOKV_CHECK(j[field].is_array(), "field '{}' is not a list", field);
  for (const auto& v : j[field]) out.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  return out;
}

}  // namespace

std::vector<LongbenchExample> read_longbench_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PROTOKV_CHECK(in.good(), "cannot read LongBench file {}", path);
  std::vector<LongbenchExample> examples;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    LongbenchExample ex;
    ex.line = line_no;
    ex.id = fmt::format("line{}", line_no);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    try {
      PROTOKV_CHECK(!j.is_discarded() && j.is_object(), "not a JSON object");
      if (j.contains("_id") && j["_id"].is_string()) ex.id = j["_id"].get<std::string>();
      for (const char* field : {"input", "context", "answers"})
        PROTOKV_CHECK(j.contains(field), "missing field '{}'", field);
      PROTOKV_CHECK(j["input"].is_string() && j["context"].is_string(),
                    "fields 'input' and 'context' must be strings");
      ex.input = j["input"].get<std::string>();
      ex.context = j["context"].get<std::string>();
      ex.answers = string_list(j, "answers");
      PROTOKV_CHECK(!ex.answers.empty(), "field 'answers' is empty");
      ex.all_classes = string_list(j, "all_classes");
      if (j.contains("length") && j["length"].is_number()) {
        // A word count; converted through double, as a number like 2e67 does not fit int64_t.
        const double length = j["length"].get<double>();
        PROTOKV_CHECK(length >= 0 && length <= 1e15 && length == std::floor(length),
                      "field 'length' must be a whole number of words, got {}", length);
        ex.length = static_cast<int64_t>(length);
      }
    } catch (const Error& e) {
      ex.error = fmt::format("{} line {}: {}", path, line_no, e.what());
    }
    examples.push_back(std::move(ex));
  }
  return examples;
}

std::string longbench_bucket(int64_t length) {
  if (length < 4000) return "0-4k";
  if (length < 8000) return "4-8k";
  return "8k+";
}

ChatWrap longbench_chat_wrap(const LongbenchDataset& dataset, const Tokenizer& tokenizer) {
  if (!dataset.chat_template || tokenizer.chat_template().empty()) return {};
  // Render the template around a marker that cannot occur in it, then split at the marker.
  static constexpr std::string_view kMarker = "\x01protokv-longbench-prompt\x01";
  const ChatMessage user{"user", std::string(kMarker)};
  const std::string rendered =
      render_chat(detect_chat_template(tokenizer.chat_template()), {&user, 1},
                  /*add_generation_prompt=*/true);
  const size_t at = rendered.find(kMarker);
  PROTOKV_CHECK(at != std::string::npos, "chat template dropped the user message");
  return {rendered.substr(0, at), rendered.substr(at + kMarker.size())};
}

LongctxSample make_longbench_sample(const Tokenizer& tokenizer, const LongbenchDataset& dataset,
                                    const LongbenchExample& example, int64_t max_length,
                                    int64_t context_length) {
  LongctxSample sample;
  sample.id = dataset.name + "/" + example.id;
  sample.answers = example.answers;
  sample.max_new_tokens = dataset.max_new_tokens;
  sample.meta = {{"dataset", dataset.name},
                 {"length", example.length},
                 {"bucket", longbench_bucket(example.length)},
                 {"all_classes", example.all_classes},
                 {"metric", dataset.metric},
                 {"first_line_only", dataset.first_line_only},
                 {"line", example.line}};
  if (!example.error.empty()) {
    sample.error = example.error;
    return sample;
  }
  auto fill_input = [&](std::string text) {
    for (size_t p = text.find("{input}"); p != std::string::npos; p = text.find("{input}", p)) {
      text.replace(p, 7, example.input);
      p += example.input.size();
    }
    return text;
  };
  const size_t at = dataset.prompt.find("{context}");
  const ChatWrap chat = longbench_chat_wrap(dataset, tokenizer);
  const std::string before = fill_input(dataset.prompt.substr(0, at));
  const std::string after = fill_input(dataset.prompt.substr(at + 9));
  std::vector<int32_t> context = tokenizer.encode(chat.prefix + before + example.context, true);
  std::vector<int32_t> question = tokenizer.encode(after + chat.suffix, false);
  const int64_t total = static_cast<int64_t>(context.size() + question.size());
  sample.meta["prompt_tokens_before_truncation"] = total;
  if (max_length > 0) {
    // Never more than the model can hold with the dataset's new tokens.
    const int64_t limit = std::min(max_length, context_length - dataset.max_new_tokens);
    if (limit < 16) {
      sample.error = fmt::format(
          "{} generates up to {} tokens: no room for a prompt in the model's {}-token context",
          dataset.name, dataset.max_new_tokens, context_length);
      return sample;
    }
    if (total > limit) {
      // pred.py: keep the first and the last limit/2 tokens.
      const int64_t half = limit / 2;
      const auto q = static_cast<int64_t>(question.size());
      if (q <= half) {
        std::vector<int32_t> cut(context.begin(), context.begin() + half);
        cut.insert(cut.end(), context.end() - (half - q), context.end());
        context = std::move(cut);
      } else {
        std::vector<int32_t> all = context;
        all.insert(all.end(), question.begin(), question.end());
        context.assign(all.begin(), all.begin() + half);
        context.insert(context.end(), all.end() - half, all.end());
        question.clear();
      }
      sample.meta["truncated"] = true;
    }
  } else {
    PROTOKV_CHECK(total + dataset.max_new_tokens <= context_length,
                  "{} sample {} (line {}): the prompt is {} tokens + {} new tokens, beyond the "
                  "model's context of {}; set a maximum length (LongBench truncates the middle)",
                  dataset.name, example.id, example.line, total, dataset.max_new_tokens,
                  context_length);
  }
  sample.context = std::move(context);
  sample.question = std::move(question);
  return sample;
}

// ---- metrics ------------------------------------------------------------------------------

namespace {

bool is_space(char32_t c) {
  // Python str.split() whitespace (ASCII part, plus the common Unicode spaces).
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 ||
         c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_ascii_punct(char32_t c) {  // Python string.punctuation
  return c < 0x80 && ((c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
                      (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E));
}

bool is_zh_punct(char32_t c) {
  // metrics.py normalize_zh_answer's cn_punctuation.
  static const std::u32string kCn = text::to_code_points(
      "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔"
      "〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏.");
  return is_ascii_punct(c) || kCn.find(c) != std::u32string::npos;
}

char32_t lower(char32_t c) {
  // ASCII and Latin-1 letters; Python's str.lower covers all of Unicode (approximation).
  if ((c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  return c;
}

std::vector<std::u32string> split_ws(const std::u32string& s) {
  std::vector<std::u32string> out;
  std::u32string cur;
  for (char32_t c : s) {
    if (is_space(c)) {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

bool is_word_char(char32_t c) {
  // \w: letters, digits, underscore; non-ASCII counted as word characters (approximation of
  // Python's Unicode \w, exact for letters and CJK).
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         (c >= 0x80 && !is_space(c));
}

// metrics.py normalize_answer: lower, remove punctuation, remove articles, fix whitespace.
std::vector<std::u32string> normalize_answer_tokens(const std::string& s) {
  std::u32string t;
  for (char32_t c : text::to_code_points(s)) {
    c = lower(c);
    if (!is_ascii_punct(c)) t += c;
  }
  // \b(a|an|the)\b -> " "
  std::u32string u;
  for (size_t i = 0; i < t.size();) {
    if (is_word_char(t[i])) {
      size_t j = i;
      while (j < t.size() && is_word_char(t[j])) ++j;
      const std::u32string word = t.substr(i, j - i);
      if (word == U"a" || word == U"an" || word == U"the") {
        u += U' ';
      } else {
        u += word;
      }
      i = j;
    } else {
      u += t[i++];
    }
  }
  return split_ws(u);
}

double f1_of(const std::vector<std::u32string>& pred, const std::vector<std::u32string>& truth) {
  std::map<std::u32string, int> counts;
  for (const auto& t : truth) ++counts[t];
  int same = 0;
  for (const auto& p : pred) {
    auto it = counts.find(p);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0) return 0.0;
  const double precision = static_cast<double>(same) / static_cast<double>(pred.size());
  const double recall = static_cast<double>(same) / static_cast<double>(truth.size());
  return 2.0 * precision * recall / (precision + recall);
}

// Stand-in for jieba.cut: one token per non-ASCII character, per ASCII alphanumeric run, per
// other ASCII character.
std::vector<std::u32string> segment_zh(const std::string& s) {
  std::vector<std::u32string> out;
  const std::u32string t = text::to_code_points(s);
  for (size_t i = 0; i < t.size();) {
    const char32_t c = t[i];
    const bool alnum =
        c < 0x80 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'));
    if (alnum) {
      size_t j = i;
      while (j < t.size() && t[j] < 0x80 &&
             ((t[j] >= 'a' && t[j] <= 'z') || (t[j] >= 'A' && t[j] <= 'Z') ||
              (t[j] >= '0' && t[j] <= '9')))
        ++j;
      out.push_back(t.substr(i, j - i));
      i = j;
    } else {
      out.push_back(std::u32string(1, c));
      ++i;
    }
  }
  return out;
}

std::vector<std::string> digit_runs(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    if (s[i] >= '0' && s[i] <= '9') {
      size_t j = i;
      while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

// Share of the numbers in the prediction equal to `id` (count_score / retrieval_score).
double share_equal(const std::string& prediction, const std::string& id) {
  const auto numbers = digit_runs(prediction);
  if (numbers.empty()) return 0.0;
  int right = 0;
  for (const auto& n : numbers) right += n == id ? 1 : 0;
  return static_cast<double>(right) / static_cast<double>(numbers.size());
}

// The number right after the first occurrence of `marker` followed by digits (re.findall(
// marker + r"(\d+)", truth)[0]); empty when none.
std::string first_id_after(const std::string& truth, const std::string& marker) {
  for (size_t p = truth.find(marker); p != std::string::npos; p = truth.find(marker, p + 1)) {
    size_t j = p + marker.size();
    size_t k = j;
    while (k < truth.size() && truth[k] >= '0' && truth[k] <= '9') ++k;
    if (k > j) return truth.substr(j, k - j);
  }
  return "";
}

// rouge_score.py's sentence split and normalisation: hyp.split(".") keeping non-empty pieces,
// each " ".join(piece.split()), then words = sentence.split(" ").
std::vector<std::vector<std::u32string>> rouge_sentences(const std::string& text) {
  std::vector<std::vector<std::u32string>> sentences;
  size_t start = 0;
  while (true) {
    const size_t dot = text.find('.', start);
    const std::string piece =
        text.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!piece.empty()) {
      auto words = split_ws(text::to_code_points(piece));
      if (words.empty()) words.push_back(U"");  // "".split(" ") == [""]
      sentences.push_back(std::move(words));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return sentences;
}

// Words of _recon_lcs(x, y): the LCS reconstructed from the end, preferring to move up (drop
// from x) only when that keeps a strictly longer LCS, as rouge_score.py does.
std::vector<std::u32string> recon_lcs(const std::vector<std::u32string>& x,
                                      const std::vector<std::u32string>& y) {
  const size_t n = x.size(), m = y.size();
  std::vector<std::vector<int>> t(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j)
      t[i][j] = x[i - 1] == y[j - 1] ? t[i - 1][j - 1] + 1 : std::max(t[i - 1][j], t[i][j - 1]);
  std::vector<std::u32string> out;
  size_t i = n, j = m;
  while (i > 0 && j > 0) {
    if (x[i - 1] == y[j - 1]) {
      out.push_back(x[i - 1]);
      --i;
      --j;
    } else if (t[i - 1][j] > t[i][j - 1]) {
      --i;
    } else {
      --j;
    }
  }
  return out;
}

size_t lcs_length(const std::u32string& a, const std::u32string& b) {
  std::vector<size_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

double qa_f1_score(const std::string& prediction, const std::string& truth) {
  return f1_of(normalize_answer_tokens(prediction), normalize_answer_tokens(truth));
}

double qa_f1_zh_score(const std::string& prediction, const std::string& truth) {
  auto normalise = [](const std::string& s) {
    std::vector<std::u32string> tokens;
    for (const auto& tok : segment_zh(s)) {
      std::u32string t;
      for (char32_t c : tok)
        if (!is_zh_punct(c) && !is_space(c)) t += lower(c);
      if (!t.empty()) tokens.push_back(t);
    }
    return tokens;
  };
  return f1_of(normalise(prediction), normalise(truth));
}

double rouge_score(const std::string& prediction, const std::string& truth) {
  const auto hyp = rouge_sentences(prediction);
  const auto ref = rouge_sentences(truth);
  if (hyp.empty() || ref.empty()) return 0.0;  // the package raises; metrics.py returns 0
  std::set<std::u32string> ref_words, hyp_words, lcs_union;
  for (const auto& s : ref) ref_words.insert(s.begin(), s.end());
  for (const auto& s : hyp) hyp_words.insert(s.begin(), s.end());
  for (const auto& r : ref)
    for (const auto& h : hyp)
      for (auto& w : recon_lcs(r, h)) lcs_union.insert(std::move(w));
  const double llcs = static_cast<double>(lcs_union.size());
  const double r_lcs = llcs / static_cast<double>(ref_words.size());
  const double p_lcs = llcs / static_cast<double>(hyp_words.size());
  return 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8));
}

double rouge_zh_score(const std::string& prediction, const std::string& truth) {
  auto joined = [](const std::string& s) {
    std::u32string out;
    for (const auto& tok : segment_zh(s)) {
      if (!out.empty()) out += U' ';
      out += tok;
    }
    return text::from_code_points(out);
  };
  return rouge_score(joined(prediction), joined(truth));
}

double classification_score(const std::string& prediction, const std::string& truth,
                            const std::vector<std::string>& all_classes) {
  std::vector<std::string> matches;
  for (const auto& c : all_classes)
    if (prediction.find(c) != std::string::npos) matches.push_back(c);
  // Python's `for t in list: list.remove(t)` skips the element after each removal.
  for (size_t i = 0; i < matches.size(); ++i) {
    if (truth.find(matches[i]) != std::string::npos && matches[i] != truth) {
      matches.erase(matches.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  // `em_match_list != 0` is always true in metrics.py: the difflib fallback never runs.
  if (std::find(matches.begin(), matches.end(), truth) == matches.end()) return 0.0;
  return 1.0 / static_cast<double>(matches.size());
}

double retrieval_score(const std::string& prediction, const std::string& truth) {
  const std::string id = first_id_after(truth, "Paragraph ");
  return id.empty() ? 0.0 : share_equal(prediction, id);
}

double retrieval_zh_score(const std::string& prediction, const std::string& truth) {
  const std::string id = first_id_after(truth, "段落");
  return id.empty() ? 0.0 : share_equal(prediction, id);
}

double count_score(const std::string& prediction, const std::string& truth) {
  return share_equal(prediction, truth);
}

double code_sim_score(const std::string& prediction, const std::string& truth) {
  size_t start = prediction.find_first_not_of('\n');
  std::string chosen;
  if (start != std::string::npos) {
    while (start <= prediction.size()) {
      const size_t nl = prediction.find('\n', start);
      const std::string line = prediction.substr(start, nl == std::string::npos ? nl : nl - start);
      if (line.find('`') == std::string::npos && line.find('#') == std::string::npos &&
          line.find("//") == std::string::npos) {
        chosen = line;
        break;
      }
      if (nl == std::string::npos) break;
      start = nl + 1;
    }
  }
  const std::u32string a = text::to_code_points(chosen), b = text::to_code_points(truth);
  if (a.empty() || b.empty()) return 0.0;  // fuzz.ratio of an empty string
  const double ratio =
      2.0 * static_cast<double>(lcs_length(a, b)) / static_cast<double>(a.size() + b.size());
  return std::nearbyint(100.0 * ratio) / 100.0;  // int(round(100 * ratio)), half to even
}

double longbench_metric(const std::string& metric, const std::string& prediction,
                        const std::string& truth, const std::vector<std::string>& all_classes) {
  if (metric == "qa_f1") return qa_f1_score(prediction, truth);
  if (metric == "qa_f1_zh") return qa_f1_zh_score(prediction, truth);
  if (metric == "rouge") return rouge_score(prediction, truth);
  if (metric == "rouge_zh") return rouge_zh_score(prediction, truth);
  if (metric == "classification") return classification_score(prediction, truth, all_classes);
  if (metric == "retrieval") return retrieval_score(prediction, truth);
  if (metric == "retrieval_zh") return retrieval_zh_score(prediction, truth);
  if (metric == "count") return count_score(prediction, truth);
  if (metric == "code_sim") return code_sim_score(prediction, truth);
  fail("unknown LongBench metric '{}'", metric);
}

double longbench_score(const LongctxSample& sample, const std::string& prediction) {
  std::string pred = prediction;
  if (sample.meta.value("first_line_only", false)) {
    // prediction.lstrip('\n').split('\n')[0]
    const size_t start = pred.find_first_not_of('\n');
    pred = start == std::string::npos ? "" : pred.substr(start);
    pred = pred.substr(0, pred.find('\n'));
  }
  const std::string metric = sample.meta.value("metric", "qa_f1");
  const auto classes = sample.meta.value("all_classes", std::vector<std::string>{});
  double best = 0.0;
  for (const auto& truth : sample.answers)
    best = std::max(best, longbench_metric(metric, pred, truth, classes));
  return best;
}

}  // namespace protokv::eval
