// SPDX-License-Identifier: Apache-2.0
#include "server/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "protokv/error.h"
#include "protokv/limits.h"

namespace protokv::server {

ApiError::ApiError(int status, const std::string& message, std::string param, std::string type,
                   std::string code)
    : std::runtime_error(Error::one_line(message)),
      status_(status),
      param_(std::move(param)),
      type_(std::move(type)),
      code_(std::move(code)) {}

nlohmann::json ApiError::to_json() const {
  auto optional = [](const std::string& s) {
    return s.empty() ? nlohmann::json() : nlohmann::json(s);
  };
  return {{"error",
           {{"message", what()},
            {"type", type_},
            {"param", optional(param_)},
            {"code", optional(code_)}}}};
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

const nlohmann::json* field(const nlohmann::json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const nlohmann::json& body, const char* name, double lo, double hi) {
  const nlohmann::json& v = *field(body, name);
  if (!v.is_number()) bad(name, fmt::format("'{}' must be a number", name));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    bad(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x));
  return x;
}

int64_t integer(const nlohmann::json& body, const char* name, int64_t lo, int64_t hi) {
  const nlohmann::json& v = *field(body, name);
  if (!v.is_number_integer()) bad(name, fmt::format("'{}' must be an integer", name));
  // Unsigned values above INT64_MAX read as negative through get<int64_t>: reject them first.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    bad(name, fmt::format("'{}' must be in [{}, {}]", name, lo, hi));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x));
  return x;
}

bool boolean(const nlohmann::json& body, const char* name, bool fallback) {
  const nlohmann::json* v = field(body, name);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) bad(name, fmt::format("'{}' must be a boolean", name));
  return v->get<bool>();
}

std::string text_of(const nlohmann::json& v, const std::string& param) {
  if (!v.is_string()) bad(param, fmt::format("'{}' must be a string", param));
  return v.get<std::string>();
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts (joined).
std::string message_content(const nlohmann::json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(param, "message content must be a string or an array of parts");
  std::string text;
  for (const auto& part : content) {
    // Compared as JSON: a "type" that is not a string is refused, not a type error.
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
        !part.contains("text"))
      bad(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
    text += text_of(part["text"], param + ".text");
  }
  return text;
}

std::vector<ChatMessage> parse_messages(const nlohmann::json& body) {
  const nlohmann::json* messages = field(body, "messages");
  if (messages == nullptr) bad("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty())
    bad("messages", "'messages' must be a non-empty array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages->size(); ++i) {
    const nlohmann::json& m = (*messages)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(param, "each message must be an object");
    if (!m.contains("role")) bad(param + ".role", "each message needs a 'role'");
    std::string role = text_of(m["role"], param + ".role");
    if (role == "developer") role = "system";  // OpenAI's newer name for the system turn
    if (role != "system" && role != "user" && role != "assistant")
      bad(param + ".role",
          fmt::format("role '{}' is not supported (system, developer, user, assistant)", role));
    if (!m.contains("content") || m["content"].is_null())
      bad(param + ".content", "each message needs 'content'");
    out.push_back({role, message_content(m["content"], param + ".content")});
  }
  return out;
}

void parse_prompt(const nlohmann::json& body, CompletionRequest& r) {
  const nlohmann::json* prompt = field(body, "prompt");
  if (prompt == nullptr) bad("prompt", "'prompt' is required");
  if (prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
    if (r.prompt.empty()) bad("prompt", "'prompt' is empty");
    return;
  }
  // One prompt as token ids; several prompts (an array of strings or of arrays) are not served.
  if (prompt->is_array() && !prompt->empty() &&
      std::all_of(prompt->begin(), prompt->end(),
                  [](const auto& t) { return t.is_number_integer(); })) {
    for (const auto& t : *prompt) {
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id > INT32_MAX) bad("prompt", fmt::format("token id {} is out of range", id));
      r.prompt_tokens.push_back(static_cast<int32_t>(id));
    }
    return;
  }
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    r.prompt = (*prompt)[0].get<std::string>();
    if (r.prompt.empty()) bad("prompt", "'prompt' is empty");
    return;
  }
  bad("prompt", "'prompt' must be a string, or one array of token ids (batches are not served)");
}

// A request may not make the server read a file: a press option naming one (a calibration
// `profile=FILE` of chelsea or pod) would let any client probe the server's files through the
// error messages, or hang it on /dev/zero. The operator's own --press may name one.
void refuse_file_options(const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return;
  for (std::string_view rest = std::string_view(spec).substr(colon + 1); !rest.empty();) {
    const size_t comma = std::min(rest.find(','), rest.size());
    const std::string_view option = rest.substr(0, comma);
    if (option.substr(0, option.find('=')) == "profile")
      bad("kv_compression.press",
          "kv_compression.press may not name a file (profile=): start the server with "
          "--press NAME:profile=FILE to use a calibration profile");
    rest.remove_prefix(std::min(comma + 1, rest.size()));
  }
}

CompressionRequest parse_compression(const nlohmann::json& body) {
  CompressionRequest c;
  const nlohmann::json* kv = field(body, "kv_compression");
  if (kv == nullptr) return c;
  if (!kv->is_object()) bad("kv_compression", "'kv_compression' must be an object");
  for (const auto& [key, value] : kv->items()) {
    if (key != "press" && key != "budget" && key != "ratio" && key != "alloc")
      bad("kv_compression." + key,
          fmt::format("unknown field kv_compression.{} (press, budget, ratio, alloc)", key));
    (void)value;
  }
  if (field(*kv, "press") != nullptr) {
    c.press = text_of((*kv)["press"], "kv_compression.press");
    refuse_file_options(*c.press);
  }
  if (field(*kv, "alloc") != nullptr) c.alloc = text_of((*kv)["alloc"], "kv_compression.alloc");
  try {
    if (field(*kv, "budget") != nullptr) c.budget = integer(*kv, "budget", 1, INT32_MAX);
    if (field(*kv, "ratio") != nullptr) c.ratio = number(*kv, "ratio", 1e-9, 1.0);
  } catch (const ApiError& e) {
    throw ApiError(400, std::string("kv_compression.") + e.what(), "kv_compression");
  }
  if (c.budget && c.ratio) bad("kv_compression", "give kv_compression.budget or .ratio, not both");
  return c;
}

std::vector<std::string> parse_stop(const nlohmann::json& body) {
  const nlohmann::json* stop = field(body, "stop");
  if (stop == nullptr) return {};
  std::vector<std::string> out;
  if (stop->is_string()) {
    out.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    if (stop->size() > limits::kMaxStopSequences)
      bad("stop", fmt::format("at most {} stop sequences, got {}", limits::kMaxStopSequences,
                              stop->size()));
    for (const auto& s : *stop) out.push_back(text_of(s, "stop"));
  } else {
    bad("stop", "'stop' must be a string or an array of strings");
  }
  for (const auto& s : out)
    if (s.empty()) bad("stop", "stop sequences must not be empty");
  return out;
}

}  // namespace

CompletionRequest parse_completion_request(const nlohmann::json& body, bool chat) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (chat)
    r.messages = parse_messages(body);
  else
    parse_prompt(body, r);
  if (field(body, "model") != nullptr) r.model = text_of(body["model"], "model");
  // max_completion_tokens is the chat API's newer name for max_tokens.
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    if (field(body, name) != nullptr) r.max_tokens = integer(body, name, 0, INT32_MAX);
  r.sampler = SamplerOptions{};  // llama-server's defaults: 0.8, 40, 0.95
  if (field(body, "temperature") != nullptr)
    r.sampler.temperature = static_cast<float>(number(body, "temperature", 0.0, 2.0));
  if (field(body, "top_p") != nullptr)
    r.sampler.top_p = static_cast<float>(number(body, "top_p", 1e-9, 1.0));
  if (field(body, "top_k") != nullptr)
    r.sampler.top_k = static_cast<int>(integer(body, "top_k", 0, INT32_MAX));
  if (field(body, "seed") != nullptr) {
    const nlohmann::json& seed = body["seed"];
    if (!seed.is_number_integer()) bad("seed", "'seed' must be an integer");
    r.sampler.seed = seed.is_number_unsigned() ? seed.get<uint64_t>()
                                               : static_cast<uint64_t>(seed.get<int64_t>());
    r.seed_given = true;
  } else {
    r.sampler.seed = std::random_device{}();
  }
  if (field(body, "n") != nullptr && integer(body, "n", 1, 1) != 1)
    bad("n", "only n = 1 is served");
  r.stop = parse_stop(body);
  r.ignore_eos = boolean(body, "ignore_eos", false);
  r.cache_prompt = boolean(body, "cache_prompt", true);
  r.stream = boolean(body, "stream", false);
  if (const nlohmann::json* options = field(body, "stream_options")) {
    if (!options->is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*options, "include_usage", false);
  }
  r.compression = parse_compression(body);
  return r;
}

std::string StopMatcher::push(std::string_view piece) {
  if (stopped_) return "";
  held_ += piece;
  // The earliest complete stop string ends the text.
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? "" : out;
}

nlohmann::json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

}  // namespace protokv::server
