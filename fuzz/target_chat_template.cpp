// SPDX-License-Identifier: Apache-2.0
// Chat templates: a model's Jinja template text recognised (detect_chat_template) or a family
// forced, and fuzzed messages rendered. protokv executes no template language: the families are
// formatted by its own code, so the input here is the template text and the conversation.
//
// Input layout: byte 0 < 0x80 picks a family (mod their count); otherwise the bytes up to the
// first NUL are a Jinja template to recognise. Then one byte of flags (bit 0: add the generation
// prompt), then messages separated by 0x1E, each a role byte (mod 4: system, user, assistant, or
// a role no family knows) followed by its content.
#include <nlohmann/json.hpp>

#include "fuzz_target.h"
#include "protokv/tokenizer.h"

namespace protokv::fuzz {
namespace {

constexpr int kFamilies = static_cast<int>(ChatTemplate::kDeepseek3) + 1;
constexpr char kMessageSeparator = '\x1e';
constexpr const char* kRoles[] = {"system", "user", "assistant", "tool"};

Outcome run(Bytes data) {
  std::string_view rest(reinterpret_cast<const char*>(data.data()), data.size());
  return accept_or_refuse([&] {
    if (rest.empty()) fail("empty input");
    ChatTemplate family;
    if (static_cast<uint8_t>(rest[0]) < 0x80) {
      family = static_cast<ChatTemplate>(rest[0] % kFamilies);
      rest.remove_prefix(1);
    } else {
      const size_t end = std::min(rest.find('\0', 1), rest.size());
      family = detect_chat_template(rest.substr(1, end - 1));
      rest.remove_prefix(std::min(end + 1, rest.size()));
    }
    const bool add_generation_prompt = !rest.empty() && (rest[0] & 1) != 0;
    if (!rest.empty()) rest.remove_prefix(1);
    std::vector<ChatMessage> messages;
    while (!rest.empty()) {
      const size_t end = std::min(rest.find(kMessageSeparator), rest.size());
      const std::string_view message = rest.substr(0, end);
      if (!message.empty())
        messages.push_back(
            {kRoles[static_cast<uint8_t>(message[0]) % 4], std::string(message.substr(1))});
      rest.remove_prefix(std::min(end + 1, rest.size()));
    }
    const std::string text = render_chat(family, messages, add_generation_prompt);
    (void)chat_template_name(family);
    if (messages.empty() && !add_generation_prompt && !text.empty() && text.size() > 64)
      finding("an empty conversation rendered as more than a header");
  });
}

std::string conversation(std::string_view head, bool generation_prompt) {
  std::string out(head);
  out.push_back(generation_prompt ? '\x01' : '\x00');
  const std::pair<int, const char*> turns[] = {
      {0, "You are terse."}, {1, "What is 2+2?"}, {2, "4"}, {1, "And <|im_end|> [INST]?"}};
  for (const auto& [role, content] : turns) {
    out.push_back(static_cast<char>(role));
    out += content;
    out.push_back(kMessageSeparator);
  }
  return out;
}

void write_seeds(const std::filesystem::path& dir, const std::filesystem::path& shared) {
  for (int family = 0; family < kFamilies; ++family)
    write_seed(dir, "family-" + std::to_string(family),
               conversation(std::string(1, static_cast<char>(family)), family % 2 == 0));
  if (shared.empty()) return;
  for (const char* name : {"llama3", "qwen3"}) {
    const auto path = shared / "tokenizers" / "hf" / name / "tokenizer_config.json";
    if (!std::filesystem::exists(path)) continue;
    const auto config = nlohmann::json::parse(read_file_bytes(path));
    if (!config.contains("chat_template") || !config["chat_template"].is_string()) continue;
    write_seed(dir, std::string("jinja-") + name,
               conversation("\x80" + config["chat_template"].get<std::string>() + '\0', true));
  }
}

}  // namespace

extern const Target kChatTemplate = {
    "chat_template", "a chat template's text and the messages rendered with it", run, write_seeds};

}  // namespace protokv::fuzz
