// SPDX-License-Identifier: Apache-2.0
// Hugging Face tokenizer.json (+ tokenizer_config.json beside it) for byte-level BPE models
// (Llama 3, Qwen2/2.5/3, GPT-2 style). Anything this reader does not implement exactly is
// rejected with one clear error rather than tokenized approximately.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "protokv/error.h"
#include "protokv/tokenizer.h"
#include "tokenizer/bpe.h"
#include "tokenizer/impl.h"

namespace protokv {

std::shared_ptr<Tokenizer> make_tokenizer(std::unique_ptr<Tokenizer::Impl> impl);

namespace {

using nlohmann::json;

json read_json(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  PROTOKV_CHECK(in.good(), "cannot open {} {}", what, path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  json parsed = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  PROTOKV_CHECK(!parsed.is_discarded() && parsed.is_object(), "{} {} is not a valid JSON object",
                what, path);
  return parsed;
}

std::string type_of(const json& node) {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) return "";
  return node["type"].get<std::string>();
}

// Collects the regexes of a pre_tokenizer node, in application order.
void collect_pre_tokenizer(const json& node, std::vector<std::string>& regexes,
                           const std::string& path) {
  const std::string type = type_of(node);
  if (type == "Sequence") {
    PROTOKV_CHECK(node.contains("pretokenizers") && node["pretokenizers"].is_array(),
                  "{}: pre_tokenizer Sequence without a pretokenizers list", path);
    for (const json& child : node["pretokenizers"]) collect_pre_tokenizer(child, regexes, path);
  } else if (type == "Split") {
    const json& pattern = node.value("pattern", json::object());
    PROTOKV_CHECK(pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string(),
                  "{}: pre_tokenizer Split needs a Regex pattern", path);
    PROTOKV_CHECK(node.value("behavior", "") == "Isolated" && !node.value("invert", false),
                  "{}: unsupported Split behavior '{}' (only Isolated, not inverted)", path,
                  node.value("behavior", ""));
    regexes.push_back(pattern["Regex"].get<std::string>());
  } else if (type == "ByteLevel") {
    PROTOKV_CHECK(!node.value("add_prefix_space", false),
                  "{}: unsupported ByteLevel pre-tokenizer with add_prefix_space", path);
    if (node.value("use_regex", true)) {
      regexes.push_back(
          "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
    }
  } else {
    fail("{}: unknown pre-tokenizer '{}' (supported: Sequence, Split, ByteLevel)", path,
         type.empty() ? node.dump() : type);
  }
}

// "bos_token" in tokenizer_config.json is a string or an AddedToken object.
std::string token_content(const json& node) {
  if (node.is_string()) return node.get<std::string>();
  if (node.is_object() && node.contains("content") && node["content"].is_string()) {
    return node["content"].get<std::string>();
  }
  return "";
}

}  // namespace

std::shared_ptr<Tokenizer> Tokenizer::from_hf_json(const std::string& path) {
  const json root = read_json(path, "tokenizer.json");
  auto impl = std::make_unique<Impl>();
  impl->model = Model::kByteLevelBpe;
  impl->add_bos = false;

  PROTOKV_CHECK(root.contains("model") && root["model"].is_object(),
                "{}: no \"model\" object (is this a tokenizer.json?)", path);
  const json& model = root["model"];
  PROTOKV_CHECK(type_of(model) == "BPE", "{}: unsupported tokenizer model '{}' (only BPE)", path,
                type_of(model));
  PROTOKV_CHECK(!model.value("byte_fallback", false),
                "{}: BPE with byte_fallback (SentencePiece-style) is not supported", path);
  PROTOKV_CHECK(model.contains("vocab") && model["vocab"].is_object() && !model["vocab"].empty(),
                "{}: model.vocab is missing or empty", path);
  PROTOKV_CHECK(model.contains("merges") && model["merges"].is_array() && !model["merges"].empty(),
                "{}: model.merges is missing or empty", path);
  impl->ignore_merges = model.value("ignore_merges", false);

  // Vocabulary: model.vocab plus added_tokens (which may extend it).
  std::vector<std::pair<int64_t, std::string>> entries;
  int64_t max_id = -1;
  for (const auto& [piece, id] : model["vocab"].items()) {
    PROTOKV_CHECK(id.is_number_integer(), "{}: vocab entry '{}' has a non-integer id", path, piece);
    entries.emplace_back(id.get<int64_t>(), piece);
    max_id = std::max(max_id, id.get<int64_t>());
  }
  struct Added {
    int64_t id;
    std::string content;
    bool special;
  };
  std::vector<Added> added;
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    for (const json& token : root["added_tokens"]) {
      PROTOKV_CHECK(token.is_object() && token.contains("id") && token["id"].is_number_integer() &&
                        token.contains("content") && token["content"].is_string(),
                    "{}: malformed added_tokens entry {}", path, token.dump());
      PROTOKV_CHECK(!token.value("lstrip", false) && !token.value("rstrip", false) &&
                        !token.value("single_word", false),
                    "{}: added token '{}' uses lstrip/rstrip/single_word (not supported)", path,
                    token["content"].get<std::string>());
      added.push_back({token["id"].get<int64_t>(), token["content"].get<std::string>(),
                       token.value("special", false)});
      max_id = std::max(max_id, added.back().id);
    }
  }
  PROTOKV_CHECK(max_id >= 0 && max_id < kMaxVocabSize, "{}: token ids out of range (max {})", path,
                max_id);
  const size_t n = static_cast<size_t>(max_id) + 1;
  impl->pieces.assign(n, std::string());
  impl->types.assign(n, kUnused);  // ids no entry names stay unused
  for (auto& [id, piece] : entries) {
    PROTOKV_CHECK(id >= 0, "{}: negative token id {}", path, id);
    impl->pieces[id] = std::move(piece);
    impl->types[id] = kNormal;
  }
  for (const Added& token : added) {
    PROTOKV_CHECK(token.id >= 0, "{}: negative token id {}", path, token.id);
    impl->pieces[token.id] = token.content;
    impl->types[token.id] = token.special ? kControl : kUserDefined;
  }

  for (const json& merge : model["merges"]) {
    if (merge.is_string()) {
      impl->merges.push_back(merge.get<std::string>());
    } else {
      PROTOKV_CHECK(
          merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
          "{}: malformed merge {}", path, merge.dump());
      impl->merges.push_back(merge[0].get<std::string>() + " " + merge[1].get<std::string>());
    }
  }

  const json normalizer = root.value("normalizer", json());
  if (!normalizer.is_null()) {
    PROTOKV_CHECK(type_of(normalizer) == "NFC", "{}: unsupported normalizer '{}' (only NFC)", path,
                  type_of(normalizer).empty() ? normalizer.dump() : type_of(normalizer));
    impl->nfc_normalize = true;
  }
  const json pre = root.value("pre_tokenizer", json());
  PROTOKV_CHECK(!pre.is_null(), "{}: no pre_tokenizer", path);
  collect_pre_tokenizer(pre, impl->pre_regexes, path);
  PROTOKV_CHECK(!impl->pre_regexes.empty(), "{}: pre_tokenizer has no regex", path);
  impl->pre_tokenizer_name = tokenizer::pre_tokenizer_name_for(impl->pre_regexes);

  // tokenizer_config.json: special tokens, add_bos_token, chat template.
  const auto config_path =
      (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  if (std::filesystem::exists(config_path)) {
    const json config = read_json(config_path, "tokenizer_config.json");
    auto id_of = [&](const char* key) -> int32_t {
      if (!config.contains(key)) return -1;
      const std::string content = token_content(config[key]);
      if (content.empty()) return -1;
      for (size_t i = 0; i < n; ++i) {
        if (impl->pieces[i] == content) return static_cast<int32_t>(i);
      }
      fail("{}: {} '{}' is not in the vocabulary", config_path, key, content);
    };
    impl->bos_id = id_of("bos_token");
    impl->eos_id = id_of("eos_token");
    impl->unk_id = id_of("unk_token");
    // Without add_bos_token, a model that names a BOS token wants it (Llama 3).
    impl->add_bos = config.value("add_bos_token", impl->bos_id >= 0);
    if (config.contains("chat_template") && config["chat_template"].is_string()) {
      impl->chat_template = config["chat_template"].get<std::string>();
    }
  }
  return make_tokenizer(std::move(impl));
}

}  // namespace protokv
