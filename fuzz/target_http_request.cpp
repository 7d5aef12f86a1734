// SPDX-License-Identifier: Apache-2.0
// HTTP request bodies of `protokv serve` (/v1/chat/completions, /v1/completions): the body parsed
// as the server parses it, validated into a CompletionRequest, its kv_compression press parsed,
// its messages rendered with a chat template and its stop sequences run over its own text, as
// the server's make_job does before any model work. Refusals are server::ApiError (an HTTP 400
// with OpenAI's error object) or protokv::Error (which the server also answers with 400).
//
// Byte 0 picks the endpoint (bit 0: chat); the rest is the body.
#include <nlohmann/json.hpp>

#include "fuzz_target.h"
#include "protokv/press_spec.h"
#include "protokv/tokenizer.h"
#include "server/openai_api.h"

namespace protokv::fuzz {
namespace {

Outcome run(Bytes data) {
  if (data.empty()) return Outcome::kRefused;
  const bool chat = (data[0] & 1) != 0;
  const std::string_view body_text(reinterpret_cast<const char*>(data.data()) + 1, data.size() - 1);
  try {
    return accept_or_refuse([&] {
      const auto body = nlohmann::json::parse(body_text, nullptr, /*allow_exceptions=*/false);
      if (body.is_discarded()) throw server::ApiError(400, "the request body is not valid JSON");
      const server::CompletionRequest request = server::parse_completion_request(body, chat);
      if (request.compression.press)
        (void)PressSpec::parse(*request.compression.press, request.compression.alloc.value_or(""));
      std::string text = request.prompt;
      if (chat) text = render_chat(ChatTemplate::kChatml, request.messages, true);
      server::StopMatcher stops(request.stop);
      for (size_t pos = 0; pos < text.size() && !stops.stopped(); pos += 3)
        (void)stops.push(std::string_view(text).substr(pos, 3));
      (void)stops.flush();
    });
  } catch (const server::ApiError& e) {
    check_error_message(e.what());
    if (e.status() < 400 || e.status() > 599) finding("an API error with a non-error HTTP status");
    (void)e.to_json().dump();
    return Outcome::kRefused;
  }
}

void write_seeds(const std::filesystem::path& dir, const std::filesystem::path&) {
  const char* chat[] = {
      R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0,
          "stream": true, "stream_options": {"include_usage": true}, "stop": ["\n", "User:"],
          "kv_compression": {"press": "snapkv:window=8", "budget": 64, "alloc": "pyramid"}})",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
          "top_k": 40, "top_p": 0.9, "seed": 7, "ignore_eos": true, "cache_prompt": false,
          "kv_compression": {"press": "protokv", "ratio": 0.25}})",
  };
  const char* completion[] = {
      R"({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.8, "n": 1})",
      R"({"prompt": [1, 15043, 29892], "max_tokens": 4, "stop": "."})",
      R"({"prompt": "x", "kv_compression": {"press": "streaming_llm:sinks=4", "budget": 16}})",
  };
  int n = 0;
  for (const char* body : chat)
    write_seed(dir, "chat-" + std::to_string(n++), std::string("\x01") + body);
  for (const char* body : completion)
    write_seed(dir, "completion-" + std::to_string(n++), std::string("\x00", 1) + body);
}

}  // namespace

extern const Target kHttpRequest = {
    "http_request", "a /v1/chat/completions or /v1/completions request body", run, write_seeds};

}  // namespace protokv::fuzz
