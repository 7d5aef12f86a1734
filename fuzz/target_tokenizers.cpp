// SPDX-License-Identifier: Apache-2.0
// The tokenizer inputs: a tokenizer.json (hf_tokenizer), a GGUF vocabulary (gguf_vocab: the
// tokenizer.ggml.* keys of a model file, SentencePiece or byte-level BPE), and text through the
// real vocabularies of shared/ (tokenize). Each loaded tokenizer encodes and decodes text
// (exercise_tokenizer).
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "fuzz_target.h"
#include "model/random_model.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"
#include "tokenizer/bpe.h"

namespace protokv::fuzz {
namespace {

using nlohmann::json;

// Text that reaches the tokenizers' special cases: control tokens of the common families, bytes
// that need fallback, digits, contractions, whitespace runs, combining marks, emoji.
constexpr std::string_view kSampleText =
    "<s>Hello <|im_start|>user\nI'd say 12345 \t\t  naïve café e\xcc\x81 \xe4\xbd\xa0\xe5\xa5\xbd "
    "\xf0\x9f\x98\x80 <|endoftext|></s>\x01\x7f";

Outcome run_hf_tokenizer(Bytes data) {
  const MemoryFile file(data);
  return accept_or_refuse([&] {
    const auto tokenizer = Tokenizer::from_hf_json(file.path());
    exercise_tokenizer(*tokenizer, kSampleText);
  });
}

Outcome run_gguf_vocab(Bytes data) {
  const MemoryFile file(data);
  return accept_or_refuse([&] {
    const GgufFile gguf = GgufFile::open(file.path());
    const auto tokenizer = Tokenizer::from_gguf(gguf);
    exercise_tokenizer(*tokenizer, kSampleText);
    if (!tokenizer->chat_template().empty()) {
      const ChatMessage messages[] = {{"system", "Be brief."}, {"user", "Hi"}};
      (void)render_chat(detect_chat_template(tokenizer->chat_template()), messages, true);
    }
  });
}

// ---- the real vocabularies (tokenize) ----

struct Vocabularies {
  std::vector<std::shared_ptr<Tokenizer>> all;
};

// Loaded once per process: every vocabulary of shared/tokenizers (the llama.cpp vocab GGUFs and
// the Hugging Face tokenizer.json files), and the synthetic SentencePiece vocabulary, which needs
// no files.
const Vocabularies& vocabularies() {
  static const Vocabularies loaded = [] {
    Vocabularies v;
    v.all.push_back(synthetic_tokenizer(512));
    const std::filesystem::path shared = shared_dir();
    if (shared.empty()) return v;
    const std::filesystem::path root = shared / "tokenizers";
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(root / "llama.cpp-vocab"))
      for (const auto& entry : std::filesystem::directory_iterator(root / "llama.cpp-vocab"))
        if (entry.path().extension() == ".gguf") files.push_back(entry.path());
    for (const char* name : {"llama3", "qwen3"})
      if (std::filesystem::exists(root / "hf" / name / "tokenizer.json"))
        files.push_back(root / "hf" / name / "tokenizer.json");
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      try {
        v.all.push_back(Tokenizer::load_file(path.string()));
      } catch (const Error&) {
        // A vocabulary protokv does not support (e.g. an unknown pre-tokenizer): not fuzzed.
      }
    }
    return v;
  }();
  return loaded;
}

// The first byte picks the vocabulary, the rest is the text.
Outcome run_tokenize(Bytes data) {
  if (data.empty()) return Outcome::kRefused;
  const auto& all = vocabularies().all;
  const Tokenizer& tokenizer = *all[data[0] % all.size()];
  const std::string_view text(reinterpret_cast<const char*>(data.data()) + 1, data.size() - 1);
  return accept_or_refuse([&] { exercise_tokenizer(tokenizer, text); });
}

// ---- seeds ----

// A byte-level BPE tokenizer.json by hand: the 256 byte characters, a few merges, two added
// tokens, a Split + ByteLevel pre-tokenizer (Llama 3's regex and layout).
json handmade_tokenizer_json() {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    vocab[tokenizer::byte_level_encode(std::string_view(&byte, 1))] = id++;
  }
  const std::string space = tokenizer::byte_level_encode(" ");
  json merges = json::array();
  for (const auto& [l, r] : std::vector<std::pair<std::string, std::string>>{
           {space, "t"}, {"h", "e"}, {space + "t", "he"}, {"1", "2"}, {"i", "n"}}) {
    merges.push_back(l + " " + r);
    if (!vocab.contains(l + r)) vocab[l + r] = id++;
  }
  json added = json::array();
  for (const char* special : {"<|begin_of_text|>", "<|eot_id|>"})
    added.push_back({{"id", id++},
                     {"content", special},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern",
                {{"Regex",
                  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"},
               {"add_prefix_space", false},
               {"trim_offsets", true},
               {"use_regex", false}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

// A real tokenizer.json cut to its first `keep` ids (renumbered in order), the merges among
// them and its first added tokens: small enough to mutate, with the real pre-tokenizer,
// normaliser and added-token layout.
json truncated_tokenizer_json(json t, int keep) {
  std::vector<std::pair<int64_t, std::string>> entries;
  for (const auto& [piece, id] : t["model"]["vocab"].items())
    if (id.get<int64_t>() < keep) entries.emplace_back(id.get<int64_t>(), piece);
  std::sort(entries.begin(), entries.end());
  json vocab = json::object();
  int next = 0;
  for (const auto& [id, piece] : entries) vocab[piece] = next++;
  json merges = json::array();
  for (const json& merge : t["model"]["merges"]) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ', 1);
      if (space == std::string::npos) continue;
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    if (vocab.contains(left) && vocab.contains(right) && vocab.contains(left + right))
      merges.push_back(merge);
  }
  json added = json::array();
  for (size_t i = 0; i < t["added_tokens"].size() && i < 6; ++i) {
    json token = t["added_tokens"][i];
    token["id"] = next++;
    added.push_back(token);
  }
  t["model"]["vocab"] = vocab;
  t["model"]["merges"] = merges;
  t["added_tokens"] = added;
  return t;
}

void write_hf_seeds(const std::filesystem::path& dir, const std::filesystem::path& shared) {
  write_seed(dir, "handmade", handmade_tokenizer_json().dump(1));
  if (shared.empty()) return;
  for (const char* name : {"llama3", "qwen3"}) {
    const auto path = shared / "tokenizers" / "hf" / name / "tokenizer.json";
    if (!std::filesystem::exists(path)) continue;
    write_seed(dir, name,
               truncated_tokenizer_json(json::parse(read_file_bytes(path)), 1000).dump(1));
  }
}

// A GGUF vocabulary cut to its first `keep` tokens (and the merges among them); token-id keys
// beyond them dropped. Every other key is kept (pre-tokenizer, chat template, add_bos...).
std::string truncated_gguf_vocab(const std::filesystem::path& path, size_t keep,
                                 const std::filesystem::path& scratch) {
  const GgufFile file = GgufFile::open(path.string());
  GgufWriter writer;
  std::set<std::string> kept;
  if (const auto tokens = file.get_string_array("tokenizer.ggml.tokens"))
    for (size_t i = 0; i < tokens->size() && i < keep; ++i) kept.insert((*tokens)[i]);
  for (const auto& [key, value] : file.metadata()) {
    if (key == gguf_container::kAlignment) continue;
    GgufValue copy = value;
    if (auto* array = std::get_if<GgufArray>(&copy.data)) {
      if (key == "tokenizer.ggml.merges") {
        std::vector<GgufValue> merges;
        for (const GgufValue& merge : array->items) {
          const auto& text = std::get<std::string>(merge.data);
          const size_t space = text.find(' ', 1);
          if (space == std::string::npos) continue;
          const std::string left = text.substr(0, space), right = text.substr(space + 1);
          if (kept.count(left) && kept.count(right) && kept.count(left + right))
            merges.push_back(merge);
        }
        array->items = std::move(merges);
      } else if (array->items.size() > keep) {
        array->items.resize(keep);
      }
    } else if (key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id")) {
      const auto* id = std::get_if<uint64_t>(&copy.data);
      if (id != nullptr && *id >= keep) continue;
    }
    writer.set_value(key, std::move(copy));
  }
  writer.write(scratch.string());
  return read_file_bytes(scratch);
}

void write_gguf_vocab_seeds(const std::filesystem::path& dir, const std::filesystem::path& shared) {
  const std::filesystem::path scratch = dir / ".scratch.gguf";
  {
    GgufWriter writer;
    synthetic_tokenizer(300)->write_gguf(writer);
    writer.write(scratch.string());
    write_seed(dir, "synthetic-spm", read_file_bytes(scratch));
  }
  {
    const std::string text = handmade_tokenizer_json().dump();
    const std::filesystem::path json_path = dir / ".scratch.json";
    write_seed(dir, ".scratch.json", text);
    GgufWriter writer;
    Tokenizer::from_hf_json(json_path.string())->write_gguf(writer);
    writer.write(scratch.string());
    write_seed(dir, "handmade-bpe", read_file_bytes(scratch));
    std::filesystem::remove(json_path);
  }
  if (!shared.empty() && std::filesystem::is_directory(shared / "tokenizers" / "llama.cpp-vocab")) {
    std::vector<std::filesystem::path> files;
    for (const auto& entry :
         std::filesystem::directory_iterator(shared / "tokenizers" / "llama.cpp-vocab"))
      if (entry.path().extension() == ".gguf") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const auto& path : files)
      write_seed(dir, path.stem().string(), truncated_gguf_vocab(path, 600, scratch));
  }
  std::filesystem::remove(scratch);
}

void write_tokenize_seeds(const std::filesystem::path& dir, const std::filesystem::path& shared) {
  std::vector<std::string> texts = {std::string(kSampleText), "", " ", "\n\n\n", "a"};
  if (!shared.empty()) {
    const auto inp = shared / "tokenizers" / "llama.cpp-vocab" / "ggml-vocab-llama-spm.gguf.inp";
    if (std::filesystem::exists(inp)) {
      // llama.cpp's test texts, separated by "\n__ggml_vocab_test__\n".
      const std::string all = read_file_bytes(inp);
      const std::string separator = "\n__ggml_vocab_test__\n";
      for (size_t pos = 0; pos < all.size();) {
        const size_t end = std::min(all.find(separator, pos), all.size());
        texts.push_back(all.substr(pos, end - pos));
        pos = end + separator.size();
      }
    }
  }
  // Each text once per vocabulary (the first byte picks it; 16 covers shared/'s 14 and more).
  int n = 0;
  for (int vocabulary = 0; vocabulary < 16; ++vocabulary)
    for (size_t t = 0; t < texts.size(); t += 1 + vocabulary % 3)
      write_seed(dir, "text-" + std::to_string(n++),
                 std::string(1, static_cast<char>(vocabulary)) + texts[t]);
}

}  // namespace

extern const Target kHfTokenizer = {"hf_tokenizer", "a Hugging Face tokenizer.json",
                                    run_hf_tokenizer, write_hf_seeds};
extern const Target kGgufVocab = {"gguf_vocab",
                                  "a GGUF vocabulary (tokenizer.ggml.*: SentencePiece or BPE)",
                                  run_gguf_vocab, write_gguf_vocab_seeds};
extern const Target kTokenize = {"tokenize", "text through the real vocabularies of shared/",
                                 run_tokenize, write_tokenize_seeds, [] { (void)vocabularies(); }};

}  // namespace protokv::fuzz
