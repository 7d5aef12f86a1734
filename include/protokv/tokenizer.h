// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tokenizers of real model families behind one interface:
//  - SentencePiece-style BPE over scored pieces (llama/mistral/phi-3: GGUF tokenizer.ggml.model
//    "llama", and llama2.c tokenizer.bin),
//  - byte-level BPE over ranked merges (GPT-2, Llama 3, Qwen2/3, DeepSeek, ...: GGUF
//    tokenizer.ggml.model "gpt2", or a Hugging Face tokenizer.json).
// Special / added tokens are matched in the text before the model runs (llama.cpp's
// parse_special); see docs/tokenizers.md for the exact rules.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protokv/limits.h"

namespace protokv {

class GgufFile;
class GgufWriter;

class Tokenizer {
 public:
  // GGUF token types. kByte pieces ("<0xHH>") are SentencePiece's byte fallback; kControl and
  // kUserDefined tokens are matched whole in the text before BPE (kControl only when special
  // tokens are parsed); kControl, kUnknown, kUnused and kUndefined decode to "".
  enum TokenType : int32_t {
    kUndefined = 0,
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6
  };
  enum class Model { kSentencePiece, kByteLevelBpe };
  static constexpr int32_t kMaxVocabSize = limits::kMaxVocab;

  struct EncodeOptions {
    bool add_bos = false;
    // Match control tokens such as "<|im_start|>" in the text; false treats them as text.
    bool parse_special = true;
  };

  // llama2.c-compatible SentencePiece tokenizer (pieces use U+2581 "▁" for spaces). Encoding is
  // llama2.c's: no special-token matching, user-defined pieces merge like normal ones.
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types,
            int32_t bos_id, int32_t eos_id, int32_t unk_id);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // llama2.c tokenizer.bin (int32 max_token_length; per token: f32 score, int32 len, bytes).
  static std::shared_ptr<Tokenizer> load_llama2c(const std::string& path, int vocab_size);
  // GGUF tokenizer.ggml.model "llama" (exact SentencePiece as llama.cpp) or "gpt2" (byte-level
  // BPE with the pre-tokenizer named by tokenizer.ggml.pre); throws Error on bad metadata.
  static std::shared_ptr<Tokenizer> from_gguf(const GgufFile& file);
  // A Hugging Face tokenizer.json (BPE model); reads tokenizer_config.json from the same folder
  // when present (BOS/EOS, add_bos_token, chat_template).
  static std::shared_ptr<Tokenizer> from_hf_json(const std::string& tokenizer_json_path);
  // Loads by file content: GGUF magic -> from_gguf, otherwise tokenizer.json.
  static std::shared_ptr<Tokenizer> load_file(const std::string& path);
  // Writes tokenizer.ggml.* keys.
  void write_gguf(GgufWriter& writer) const;

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options) const;
  // Special tokens are parsed (no-op for llama2.c tokenizers, which have none to parse).
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const {
    return encode(text, EncodeOptions{add_bos, true});
  }
  // Bytes of `token` following `prev` (SentencePiece: the leading space after BOS is dropped).
  // `prev` is only compared with BOS (pass -1 for "no previous token"); `token` out of range
  // throws Error. The bytes may end inside a UTF-8 character: see Utf8StreamBuffer.
  std::string decode(int32_t prev, int32_t token) const;
  std::string decode(std::span<const int32_t> tokens) const;  // tokens may start with BOS

  Model model() const;
  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the vocabulary has none
  int32_t eos_id() const;
  int32_t unk_id() const;  // -1 when the vocabulary has none
  bool add_bos() const;    // whether the model wants BOS in front of a prompt
  // Ids that end generation: EOS plus end-of-turn tokens (<|eot_id|>, <|im_end|>, <|end|>, ...).
  const std::vector<int32_t>& end_of_generation_ids() const;
  bool is_end_of_generation(int32_t token) const;
  // The Jinja chat template stored with the tokenizer ("" when none).
  const std::string& chat_template() const;
  // The vocabulary as stored (SentencePiece: "▁" for spaces; byte-level BPE: GPT-2 byte chars).
  const std::vector<std::string>& pieces() const;
  const std::vector<float>& scores() const;  // SentencePiece scores (zeros for BPE)
  const std::vector<int32_t>& types() const;
  // Id of the token whose stored piece is exactly `piece`, or -1.
  int32_t find_token(std::string_view piece) const;

  struct Impl;

 protected:
  explicit Tokenizer(std::unique_ptr<Impl> impl);  // for the loaders (make_tokenizer)

 private:
  std::unique_ptr<Impl> impl_;
};

// Streams decoded token bytes without ever splitting a UTF-8 character: push() returns the bytes
// that complete whole characters and keeps an incomplete tail for the next call. Invalid bytes
// are passed through unchanged (they can never become valid).
class Utf8StreamBuffer {
 public:
  std::string push(std::string_view bytes);
  std::string flush();  // whatever is held back (an incomplete character at the end of output)

 private:
  std::string pending_;
};

// Chat templates: the common families rendered as their official templates do (llama.cpp's
// llama-chat.cpp formatter where the two agree; docs/tokenizers.md lists where not), selected
// from a model's Jinja template text like llm_chat_detect_template, or forced by name. The
// rendered text has no BOS: encode it with add_bos (and parse_special) to get the prompt.
struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatTemplate {
  kLlama3,
  kChatml,  // Qwen, Yi, ...
  kMistralV1,
  kMistralV3,
  kMistralV3Tekken,
  kMistralV7,
  kLlama2,
  kLlama2Sys,
  kLlama2SysBos,
  kLlama2SysStrip,
  kLlama2Chat,  // Meta's Llama-2-chat template exactly (llama.cpp: llama2-sys-strip)
  kPhi3,
  kGemma,
  kDeepseek,  // DeepSeek Coder ("### Instruction:")
  kDeepseek3,
};

// Family of a Jinja chat template; throws Error naming the known families when none matches.
ChatTemplate detect_chat_template(std::string_view jinja);
// By name ("llama3", "chatml", "qwen", "mistral-v7", "llama2", "phi3", "gemma", "deepseek", ...);
// throws Error listing the names for an unknown one.
ChatTemplate chat_template_from_name(std::string_view name);
std::string_view chat_template_name(ChatTemplate family);
// The conversation as the family formats it; with `add_generation_prompt`, followed by the
// header that opens the assistant's turn.
std::string render_chat(ChatTemplate family, std::span<const ChatMessage> messages,
                        bool add_generation_prompt);

}  // namespace protokv
