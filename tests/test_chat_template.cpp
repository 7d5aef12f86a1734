// SPDX-License-Identifier: Apache-2.0
// Chat templates: detection from the Jinja source, rendering exactly as the reference templates
// (the shared Llama 3 / Qwen3 tokenizer_config.json templates, expected strings worked out by hand
// from their Jinja), llama.cpp's formats for the other families, and errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

std::string shared_template(const std::string& model) {
  const auto path = testing::shared_dir() / "tokenizers" / "hf" / model / "tokenizer_config.json";
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::json::parse(buffer.str())["chat_template"].get<std::string>();
}

const std::vector<ChatMessage> kConversation{
    {"system", "You are helpful."},
    {"user", "  Hi there \n"},
    {"assistant", "Hello!"},
    {"user", "What is 2+2?"},
};

TEST(ChatTemplate, Llama3MatchesReferenceTemplate) {
  const std::string jinja = shared_template("llama3");
  if (jinja.empty()) GTEST_SKIP() << "shared Llama 3 tokenizer_config.json not found; skipping";
  const ChatTemplate family = detect_chat_template(jinja);
  EXPECT_EQ(family, ChatTemplate::kLlama3);
  // The Jinja: per message '<|start_header_id|>' + role + '<|end_header_id|>\n\n' +
  // content | trim + '<|eot_id|>' (bos_token before the first, which the tokenizer adds as BOS),
  // then '<|start_header_id|>assistant<|end_header_id|>\n\n'.
  EXPECT_EQ(render_chat(family, kConversation, true),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  const auto tok_path = testing::shared_dir() / "tokenizers" / "hf" / "llama3" / "tokenizer.json";
  const auto tokenizer = Tokenizer::from_hf_json(tok_path.string());
  EXPECT_EQ(detect_chat_template(tokenizer->chat_template()), ChatTemplate::kLlama3);
  const auto ids =
      tokenizer->encode(render_chat(family, std::vector<ChatMessage>{{"user", "Hi"}}, true), true);
  // BOS, then the header tokens as special tokens, not spelled out.
  const std::vector<int32_t> expected_start{128000, tokenizer->find_token("<|start_header_id|>")};
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 2), expected_start);
  EXPECT_EQ(ids.back(), tokenizer->encode("\n\n", false).back());
}

TEST(ChatTemplate, QwenMatchesReferenceTemplate) {
  const std::string jinja = shared_template("qwen3");
  if (jinja.empty()) GTEST_SKIP() << "shared Qwen3 tokenizer_config.json not found; skipping";
  const ChatTemplate family = detect_chat_template(jinja);
  EXPECT_EQ(family, ChatTemplate::kChatml);
  // Qwen3's Jinja without tools: the system message first, every user turn as
  // '<|im_start|>user\n' + content + '<|im_end|>\n', an assistant turn before the last user turn
  // as '<|im_start|>assistant\n' + content + '<|im_end|>\n', then the generation prompt
  // '<|im_start|>assistant\n' (no think block: enable_thinking is undefined).
  EXPECT_EQ(render_chat(family, kConversation, true),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n"
            "<|im_start|>user\n  Hi there \n<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(family, std::vector<ChatMessage>{{"user", "Hi"}}, false),
            "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, DetectsFamiliesFromJinja) {
  EXPECT_EQ(detect_chat_template("{{ '[INST] ' }}{{ '[SYSTEM_PROMPT]' }}"),
            ChatTemplate::kMistralV7);
  EXPECT_EQ(detect_chat_template("{{ bos_token + '[INST] <<SYS>>' }}"),
            ChatTemplate::kLlama2SysBos);
  EXPECT_EQ(detect_chat_template("[INST] <<SYS>>\\n"), ChatTemplate::kLlama2Sys);
  EXPECT_EQ(detect_chat_template("{{'<|user|>'}}{{'<|end|>'}}{{'<|assistant|>'}}"),
            ChatTemplate::kPhi3);
  EXPECT_EQ(detect_chat_template("<start_of_turn>user"), ChatTemplate::kGemma);
  EXPECT_EQ(detect_chat_template("### Instruction:\\n{{ content }}<|EOT|>"),
            ChatTemplate::kDeepseek);
  const auto phi3 =
      testing::shared_dir() / "tokenizers" / "llama.cpp-vocab" / "ggml-vocab-phi-3.gguf";
  if (std::filesystem::exists(phi3)) {
    const auto tokenizer = Tokenizer::from_gguf(GgufFile::open(phi3.string()));
    EXPECT_EQ(detect_chat_template(tokenizer->chat_template()), ChatTemplate::kPhi3);
  }
}

TEST(ChatTemplate, OtherFamiliesAsLlamaCpp) {
  const std::vector<ChatMessage> chat{
      {"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}};
  EXPECT_EQ(render_chat(ChatTemplate::kLlama2Sys, chat, true),
            "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST]A1</s>[INST] U2 [/INST]");
  EXPECT_EQ(render_chat(ChatTemplate::kMistralV7, chat, true),
            "[SYSTEM_PROMPT] S[/SYSTEM_PROMPT][INST] U1[/INST] A1</s>[INST] U2[/INST]");
  EXPECT_EQ(render_chat(ChatTemplate::kPhi3, chat, true),
            "<|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n<|assistant|>\nA1<|end|>\n<|user|>\nU2"
            "<|end|>\n<|assistant|>\n");
  EXPECT_EQ(render_chat(ChatTemplate::kGemma, chat, true),
            "<start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
            "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_chat(ChatTemplate::kDeepseek, chat, true),
            "S### Instruction:\nU1\n### Response:\nA1\n<|EOT|>\n### Instruction:\nU2\n"
            "### Response:\n");
}

TEST(ChatTemplate, Errors) {
  try {
    detect_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}");
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown chat template family"), std::string::npos);
  }
  EXPECT_THROW(detect_chat_template(""), Error);
  try {
    chat_template_from_name("no-such");
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown chat template 'no-such'"), std::string::npos);
  }
  EXPECT_EQ(chat_template_from_name("qwen"), ChatTemplate::kChatml);
  EXPECT_EQ(chat_template_name(ChatTemplate::kLlama3), "llama3");
  EXPECT_THROW(render_chat(ChatTemplate::kChatml, std::vector<ChatMessage>{{"tool", "x"}}, true),
               Error);
}

}  // namespace
}  // namespace protokv
