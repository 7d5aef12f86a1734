// SPDX-License-Identifier: Apache-2.0
#pragma once
// The OpenAI wire format of `protokv serve`: request bodies parsed and validated into plain
// structs, errors as {"error": {"message", "type", "param", "code"}} with their HTTP status, and
// the response / stream-chunk objects. No I/O here: unit-testable on hand-made JSON.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "protokv/sampler.h"
#include "protokv/tokenizer.h"

namespace protokv::server {

// An error the client gets as an HTTP status and OpenAI's error object.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "",
           std::string type = "invalid_request_error", std::string code = "");
  int status() const { return status_; }
  nlohmann::json to_json() const;

 private:
  int status_;
  std::string param_;
  std::string type_;
  std::string code_;
};

// The per-request compression extension: "kv_compression": {"press": "snapkv:window=8",
// "budget": 256 | "ratio": 0.1, "alloc": "pyramid"}. Unset fields take the server's defaults.
struct CompressionRequest {
  std::optional<std::string> press;
  std::optional<int64_t> budget;
  std::optional<double> ratio;
  std::optional<std::string> alloc;
};

struct CompletionRequest {
  bool chat = false;
  std::vector<ChatMessage> messages;   // chat
  std::string prompt;                  // completions, as text
  std::vector<int32_t> prompt_tokens;  // completions, as token ids (then `prompt` is empty)
  std::optional<int64_t> max_tokens;   // unset: the server's --n-predict
  SamplerOptions sampler;
  bool seed_given = false;
  bool ignore_eos = false;  // llama-server's extension: keep sampling after end-of-generation
  // llama-server's extension: may continue a cached conversation whose tokens start the prompt
  // (and leaves its own session cached for the next turn). Default true, as in llama-server.
  bool cache_prompt = true;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  CompressionRequest compression;
  std::string model;
};

// Sampling defaults when a request leaves a field out: llama-server's (temperature 0.8, top_k 40,
// top_p 0.95); the seed is drawn at random unless given.
// Throws ApiError(400) naming the offending field.
CompletionRequest parse_completion_request(const nlohmann::json& body, bool chat);

// Holds back generated text that could be the start of a stop string, so a stream never shows
// part of one. push() returns what may be sent now; `stopped()` once a stop string appeared (the
// text up to it was returned, the rest is dropped).
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::string push(std::string_view piece);
  std::string flush();  // at the end: whatever was held back
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

// OpenAI's token counts of one request.
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from a cached conversation
};
nlohmann::json usage_json(const Usage& usage);

}  // namespace protokv::server
