// SPDX-License-Identifier: Apache-2.0
// LongBench's official metrics (THUDM/LongBench metrics.py and eval.py), re-implemented: answer
// normalisation, token F1 (English words, Chinese characters), ROUGE-L, classification,
// retrieval, count and code similarity, and the per-sample score over every reference answer.
// The dataset table, the JSONL reader and the prompts are in longbench.cpp.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "core/text.h"
#include "eval/longbench.h"
#include "protokv/error.h"

namespace protokv::eval {

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
