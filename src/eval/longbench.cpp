// SPDX-License-Identifier: Apache-2.0
// LongBench: the dataset table (prompts, lengths, metrics of the official config), the JSONL
// reader and the samples; the official metrics are in longbench_metrics.cpp.
#include "eval/longbench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
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

}  // namespace protokv::eval
