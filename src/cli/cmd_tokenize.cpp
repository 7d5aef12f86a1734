// SPDX-License-Identifier: Apache-2.0
// `protokv tokenize`: text -> token ids (and back with --decode) with the tokenizer of a GGUF
// model, a vocabulary-only GGUF, or a Hugging Face tokenizer.json.
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "io/text_file.h"
#include "protokv/error.h"
#include "protokv/tokenizer.h"

namespace protokv::cli {
namespace {

struct TokenizeOptions {
  std::string model_path;
  std::string prompt;
  std::string file;
  bool json = false;
  bool no_special = false;
  bool bos = false;
  bool decode = false;
  bool timing = false;
};

// Ids separated by spaces, commas or newlines; brackets (a JSON list) are ignored.
std::vector<int32_t> parse_ids(const std::string& text, int32_t vocab_size) {
  std::vector<int32_t> ids;
  std::string token;
  auto flush = [&] {
    if (token.empty()) return;
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(token, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    PROTOKV_CHECK(used == token.size(), "'{}' is not a token id", token);
    PROTOKV_CHECK(id >= 0 && id < vocab_size, "token id {} out of range (vocabulary size {})", id,
                  vocab_size);
    ids.push_back(static_cast<int32_t>(id));
    token.clear();
  };
  for (const char c : text) {
    if (c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t' || c == '[' || c == ']') {
      flush();
    } else {
      token.push_back(c);
    }
  }
  flush();
  return ids;
}

// A piece for a terminal: control characters escaped.
std::string printable(std::string_view piece) {
  std::string out;
  for (const char c : piece) {
    const auto u = static_cast<uint8_t>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7F) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void run(const TokenizeOptions& o) {
  const auto tokenizer = Tokenizer::load_file(o.model_path);
  const std::string input = o.file.empty() ? o.prompt : read_text_file(o.file);
  if (o.decode) {
    const auto ids = parse_ids(input, tokenizer->vocab_size());
    const std::string text = tokenizer->decode(ids);
    if (o.json) {
      fmt::print("{}\n", nlohmann::json{{"text", text}}.dump(
                             -1, ' ', false, nlohmann::json::error_handler_t::replace));
    } else {
      fmt::print("{}\n", text);
    }
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto ids = tokenizer->encode(input, {.add_bos = o.bos, .parse_special = !o.no_special});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (o.timing) {
    fmt::print(stderr, "tokenized {} bytes into {} tokens in {:.3f} s ({:.2f} MB/s)\n",
               input.size(), ids.size(), seconds, input.size() / 1e6 / seconds);
  }
  const auto& pieces = tokenizer->pieces();
  if (o.json) {
    nlohmann::json j;
    j["ids"] = ids;
    j["pieces"] = nlohmann::json::array();
    for (const int32_t id : ids) j["pieces"].push_back(pieces[id]);
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  for (const int32_t id : ids) fmt::print("{}\t{}\n", id, printable(pieces[id]));
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Text -> token ids (or ids -> text with --decode) with a model's tokenizer");
  cmd->add_option("-m,--model", options->model_path,
                  "GGUF model, vocabulary-only GGUF, or Hugging Face tokenizer.json "
                  "(tokenizer_config.json beside it is read too)")
      ->required();
  auto* prompt = cmd->add_option("-p,--prompt", options->prompt, "text (or ids with --decode)");
  auto* file = cmd->add_option("-f,--file", options->file, "read the text (or ids) from a file");
  prompt->excludes(file);
  file->excludes(prompt);
  cmd->add_flag("--json", options->json, R"(print {"ids": [...], "pieces": [...]})");
  cmd->add_flag("--no-special", options->no_special,
                "treat special tokens such as <|im_start|> as plain text");
  cmd->add_flag("--bos", options->bos, "prepend BOS (when the vocabulary has one)");
  cmd->add_flag("--decode", options->decode, "input is token ids; print their text");
  cmd->add_flag("--time", options->timing, "print the encoding speed to stderr");
  cmd->callback([options, prompt, file] {
    PROTOKV_CHECK(prompt->count() + file->count() == 1, "give the input with -p TEXT or -f FILE");
    run(*options);
  });
}

}  // namespace protokv::cli
