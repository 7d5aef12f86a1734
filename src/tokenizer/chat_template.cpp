// SPDX-License-Identifier: Apache-2.0
// Chat templates of the common model families, detected from the Jinja source as llama.cpp's
// llm_chat_detect_template does (src/llama-chat.cpp) and rendered as the families' official
// templates do: llama.cpp's llm_chat_apply_template where the two agree, the template where not
// (docs/tokenizers.md lists where). Hand-written formatters rather than a Jinja interpreter: every
// family is tested against a cited reference rendering (tests/test_chat_template_reference.cpp).
#include <fmt/format.h>

#include <array>
#include <string>

#include "protokv/error.h"
#include "protokv/tokenizer.h"

namespace protokv {

namespace {

struct NamedTemplate {
  std::string_view name;
  ChatTemplate family;
};

constexpr std::array kNames{
    NamedTemplate{"llama3", ChatTemplate::kLlama3},
    NamedTemplate{"chatml", ChatTemplate::kChatml},
    NamedTemplate{"qwen", ChatTemplate::kChatml},
    NamedTemplate{"mistral-v1", ChatTemplate::kMistralV1},
    NamedTemplate{"mistral-v3", ChatTemplate::kMistralV3},
    NamedTemplate{"mistral-v3-tekken", ChatTemplate::kMistralV3Tekken},
    NamedTemplate{"mistral-v7", ChatTemplate::kMistralV7},
    NamedTemplate{"mistral", ChatTemplate::kMistralV7},
    NamedTemplate{"llama2", ChatTemplate::kLlama2},
    NamedTemplate{"llama2-sys", ChatTemplate::kLlama2Sys},
    NamedTemplate{"llama2-sys-bos", ChatTemplate::kLlama2SysBos},
    NamedTemplate{"llama2-sys-strip", ChatTemplate::kLlama2SysStrip},
    NamedTemplate{"llama2-chat", ChatTemplate::kLlama2Chat},
    NamedTemplate{"phi3", ChatTemplate::kPhi3},
    NamedTemplate{"gemma", ChatTemplate::kGemma},
    NamedTemplate{"deepseek", ChatTemplate::kDeepseek},
    NamedTemplate{"deepseek3", ChatTemplate::kDeepseek3},
};

std::string known_names() {
  std::string names;
  for (const auto& entry : kNames) {
    if (!names.empty()) names += ", ";
    names += entry.name;
  }
  return names;
}

// Python's str.strip() on ASCII whitespace, as llama.cpp's trim.
std::string trim(std::string_view text) {
  const char* spaces = " \t\n\r\f\v";
  const size_t begin = text.find_first_not_of(spaces);
  if (begin == std::string_view::npos) return "";
  const size_t end = text.find_last_not_of(spaces);
  return std::string(text.substr(begin, end - begin + 1));
}

}  // namespace

ChatTemplate detect_chat_template(std::string_view jinja) {
  auto has = [&](std::string_view needle) { return jinja.find(needle) != std::string_view::npos; };
  // Phi-4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) use <|im_start|> but are not ChatML.
  if (has("<|im_start|>") && !has("<|im_sep|>") && !has("<end_of_utterance>"))
    return ChatTemplate::kChatml;
  if (has("[INST]")) {
    if (has("[SYSTEM_PROMPT]")) return ChatTemplate::kMistralV7;
    if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      if (has(" [INST]")) return ChatTemplate::kMistralV1;
      if (has("\"[INST]\"")) return ChatTemplate::kMistralV3Tekken;
      return ChatTemplate::kMistralV3;
    }
    // Meta's Llama-2-chat template strips and puts BOS before every [INST]; llama.cpp files it
    // under llama2-sys-strip but renders it with different spacing (see render_chat).
    if (has("content.strip()") && has("bos_token + '[INST] ' + content.strip()"))
      return ChatTemplate::kLlama2Chat;
    if (has("content.strip()")) return ChatTemplate::kLlama2SysStrip;
    if (has("bos_token + '[INST]")) return ChatTemplate::kLlama2SysBos;
    if (has("<<SYS>>")) return ChatTemplate::kLlama2Sys;
    return ChatTemplate::kLlama2;
  }
  if (has("<|assistant|>") && has("<|end|>")) return ChatTemplate::kPhi3;
  if (has("<start_of_turn>")) return ChatTemplate::kGemma;
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatTemplate::kLlama3;
  if (has("### Instruction:") && has("<|EOT|>")) return ChatTemplate::kDeepseek;
  if (has("<\xEF\xBD\x9C"
          "Assistant\xEF\xBD\x9C>") &&
      has("<\xEF\xBD\x9C"
          "User\xEF\xBD\x9C>") &&
      has("<\xEF\xBD\x9C"
          "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>")) {
    return ChatTemplate::kDeepseek3;
  }
  PROTOKV_CHECK(!jinja.empty(), "the model has no chat template; force one by name ({})",
                known_names());
  fail("unknown chat template family; force one by name ({})", known_names());
}

ChatTemplate chat_template_from_name(std::string_view name) {
  for (const auto& entry : kNames) {
    if (entry.name == name) return entry.family;
  }
  fail("unknown chat template '{}' (known: {})", name, known_names());
}

std::string_view chat_template_name(ChatTemplate family) {
  for (const auto& entry : kNames) {
    if (entry.family == family) return entry.name;
  }
  return "?";
}

std::string render_chat(ChatTemplate family, std::span<const ChatMessage> messages,
                        bool add_generation_prompt) {
  for (const ChatMessage& m : messages) {
    PROTOKV_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
                  "chat message role '{}' is not system, user or assistant", m.role);
  }
  std::string out;
  switch (family) {
    case ChatTemplate::kLlama3:
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) +
               "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatTemplate::kChatml:
      for (const ChatMessage& m : messages) {
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatTemplate::kMistralV7:
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          out += "[SYSTEM_PROMPT] " + m.content + "[/SYSTEM_PROMPT]";
        } else if (m.role == "user") {
          out += "[INST] " + m.content + "[/INST]";
        } else {
          out += " " + m.content + "</s>";
        }
      }
      break;
    case ChatTemplate::kMistralV1: {
      bool inside_turn = false;
      for (const ChatMessage& m : messages) {
        if (!inside_turn) {
          out += " [INST] ";
          inside_turn = true;
        }
        if (m.role == "system") {
          out += m.content + "\n\n";
        } else if (m.role == "user") {
          out += m.content + " [/INST]";
        } else {
          out += " " + m.content + "</s>";
          inside_turn = false;
        }
      }
      break;
    }
    case ChatTemplate::kMistralV3:
    case ChatTemplate::kMistralV3Tekken: {
      // As the official templates (Mistral-7B-Instruct-v0.3 / Mistral-Large-2407; tekken:
      // Mistral-Nemo-2407): a leading system message goes in front of the user turn only when
      // that turn is the conversation's last message (llama.cpp puts it in the first turn).
      const bool tekken = family == ChatTemplate::kMistralV3Tekken;
      const std::string inst = tekken ? "[INST]" : "[INST] ";
      const bool has_system = !messages.empty() && messages[0].role == "system";
      for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        PROTOKV_CHECK(m.role != "system",
                      "the {} chat template takes one system message, at the start",
                      chat_template_name(family));
        if (m.role == "user") {
          const bool last = i + 1 == messages.size();
          out += inst;
          if (has_system && last) out += messages[0].content + "\n\n";
          out += m.content;
          out += "[/INST]";
        } else {
          if (!tekken) out += ' ';
          out += tekken ? m.content : trim(m.content);
          out += "</s>";
        }
      }
      break;
    }
    case ChatTemplate::kLlama2:
    case ChatTemplate::kLlama2Sys:
    case ChatTemplate::kLlama2SysBos:
    case ChatTemplate::kLlama2SysStrip: {
      const bool system_supported = family != ChatTemplate::kLlama2;
      const bool bos_inside_history = family == ChatTemplate::kLlama2SysBos;
      const bool strip = family == ChatTemplate::kLlama2SysStrip;
      bool inside_turn = true;  // the first [INST] follows the BOS the tokenizer adds
      out += "[INST] ";
      for (const ChatMessage& m : messages) {
        const std::string content = strip ? trim(m.content) : m.content;
        if (!inside_turn) {
          inside_turn = true;
          out += bos_inside_history ? "<s>[INST] " : "[INST] ";
        }
        if (m.role == "system") {
          out += system_supported ? "<<SYS>>\n" + content + "\n<</SYS>>\n\n" : content + "\n";
        } else if (m.role == "user") {
          out += content + " [/INST]";
        } else {
          out += content + "</s>";
          inside_turn = false;
        }
      }
      break;
    }
    case ChatTemplate::kLlama2Chat: {
      // Meta's Llama-2-chat template: a leading system message is wrapped in <<SYS>> in front of
      // the first user turn, the turn's whole content is strip()ped, every [INST] but the first
      // (whose BOS the tokenizer adds) gets its own BOS, and answers are ' ' + strip + ' </s>'.
      const bool has_system = !messages.empty() && messages[0].role == "system";
      for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        PROTOKV_CHECK(m.role != "system",
                      "the llama2-chat template takes one system message, at the start");
        const bool first = i == (has_system ? 1u : 0u);
        std::string content = m.content;
        if (first && has_system)
          content = fmt::format("<<SYS>>\n{}\n<</SYS>>\n\n{}", messages[0].content, content);
        if (m.role == "user") {
          out += first ? "[INST] " : "<s>[INST] ";
          out += trim(content);
          out += " [/INST]";
        } else {
          out += ' ';
          out += trim(content);
          out += " </s>";
        }
      }
      break;
    }
    case ChatTemplate::kPhi3:
      for (const ChatMessage& m : messages) {
        out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
      }
      if (add_generation_prompt) out += "<|assistant|>\n";
      break;
    case ChatTemplate::kGemma: {
      // Gemma has no system role: as Gemma 3's template, the system text (untrimmed) + "\n\n"
      // opens the next user turn (llama.cpp trims it; gemma-7b-it's template rejects it).
      std::string system;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          system += m.content;
          continue;
        }
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<start_of_turn>" + role + "\n";
        if (!system.empty() && role != "model") {
          out += system + "\n\n";
          system.clear();
        }
        out += trim(m.content) + "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    }
    case ChatTemplate::kDeepseek:
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          out += m.content;
        } else if (m.role == "user") {
          out += "### Instruction:\n" + m.content + "\n";
        } else {
          out += "### Response:\n" + m.content + "\n<|EOT|>\n";
        }
      }
      if (add_generation_prompt) out += "### Response:\n";
      break;
    case ChatTemplate::kDeepseek3: {
      // As DeepSeek-V3's template: every system message first, joined by "\n\n", right before
      // the first turn (llama.cpp appends "\n\n" after each one in place).
      std::string system;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") system += (system.empty() ? "" : "\n\n") + m.content;
      }
      out += system;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          continue;
        } else if (m.role == "user") {
          out += "<\xEF\xBD\x9CUser\xEF\xBD\x9C>" + m.content;
        } else {
          out +=
              "<\xEF\xBD\x9C"
              "Assistant\xEF\xBD\x9C>" +
              m.content +
              "<\xEF\xBD\x9C"
              "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
        }
      }
      if (add_generation_prompt)
        out +=
            "<\xEF\xBD\x9C"
            "Assistant\xEF\xBD\x9C>";
      break;
    }
  }
  return out;
}

}  // namespace protokv
