// SPDX-License-Identifier: Apache-2.0
#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "protokv/error.h"
#include "protokv/generate.h"
#include "protokv/json_keys.h"
#include "protokv/limits.h"
#include "protokv/tokenizer.h"

namespace protokv::server {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Generated text may hold invalid UTF-8 (byte-fallback pieces of a model's own making): replace,
// never throw.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  if (e.status() == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(e.to_json()), "application/json");
}

}  // namespace

struct Server::Impl {
  const LoadedModel& model;
  ServerOptions options;
  std::string model_id;
  std::optional<ChatTemplate> chat_family;
  std::string chat_error;  // why chat is unavailable, when chat_family is empty
  std::shared_ptr<const PressSpec> default_press;
  std::unique_ptr<Scheduler> scheduler;
  httplib::Server http;
  std::atomic<int64_t> next_id{1};
  std::atomic<bool> listening{false};
  std::atomic<bool> stopping{false};
  int64_t created = unix_seconds();
  int listen_socket = -1;  // recorded by socket_options(), see bind()

  Impl(const LoadedModel& m, ServerOptions o) : model(m), options(std::move(o)) {
    const ModelConfig& config = model.weights.config;
    PROTOKV_CHECK(model.tokenizer != nullptr, "protokv serve needs a model with a tokenizer");
    if (options.ctx <= 0) options.ctx = config.context_length;
    PROTOKV_CHECK(options.ctx <= config.context_length,
                  "--ctx {} is larger than the model's context of {} tokens", options.ctx,
                  config.context_length);
    PROTOKV_CHECK(options.n_predict >= 1, "--n-predict must be at least 1, got {}",
                  options.n_predict);
    PROTOKV_CHECK(options.port >= 0 && options.port <= 65535, "--port must be in 0..65535, got {}",
                  options.port);
    PROTOKV_CHECK(options.scheduler.queue_limit >= 1, "--queue must be at least 1");
    PROTOKV_CHECK(options.max_body_bytes >= limits::kMinRequestBodyBytes &&
                      options.max_body_bytes <= limits::kMaxRequestBodyBytes,
                  "--max-body must be in [{}, {}] bytes, got {}", limits::kMinRequestBodyBytes,
                  limits::kMaxRequestBodyBytes, options.max_body_bytes);
    default_press = press_spec(options.press, options.alloc);  // validates
    if (default_press != nullptr) options.budget.validate();
    model_id = options.model_alias.empty() ? std::filesystem::path(model.path).filename().string()
                                           : options.model_alias;
    try {
      chat_family = options.chat_template.empty()
                        ? detect_chat_template(model.tokenizer->chat_template())
                        : chat_template_from_name(options.chat_template);
    } catch (const Error& e) {
      if (!options.chat_template.empty()) throw;
      chat_error = fmt::format("{} (start the server with --chat-template NAME)", e.what());
    }
    scheduler = std::make_unique<Scheduler>(model, options.scheduler);
    routes();
  }

  // null for the full cache.
  static std::shared_ptr<const PressSpec> press_spec(const std::string& text,
                                                     const std::string& alloc) {
    if (text.empty() || text == "full") return nullptr;
    return PressSpec::parse(text, alloc);
  }

  void routes() {
    http.set_payload_max_length(options.max_body_bytes);
    // One HTTP thread per request in flight: each waits on its job. Bounded by the scheduler's
    // slots and queue (further requests get 503), plus a few for /health and /metrics.
    const size_t threads = static_cast<size_t>(options.scheduler.parallel) +
                           std::min<size_t>(options.scheduler.queue_limit, 256) + 4;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (options.api_key.empty() || req.path == "/health")
        return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + options.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", "",
                               "authentication_error", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    });
    http.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string message;
      switch (res.status) {
        case 404:
          message = "no such endpoint";
          break;
        case 413:
          // cpp-httplib also caps form bodies at 8 KiB, and curl -d sends one unless told
          // otherwise (the request's headers are not reliably available here).
          message = fmt::format(
              "request body larger than {} bytes, or a form-urlencoded one (curl -d's default) "
              "over 8192 bytes: send 'Content-Type: application/json'",
              options.max_body_bytes);
          break;
        default:
          message = fmt::format("HTTP {}", res.status);
      }
      send_error(res, ApiError(res.status, message));
    });
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, const std::exception_ptr& ep) {
          std::string message = "internal error";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            message = e.what();
          } catch (...) {
          }
          send_error(res, ApiError(500, message, "", "server_error"));
        });

    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    for (const char* path : {"/v1/models", "/models"}) {
      http.Get(path, [this](const httplib::Request&, httplib::Response& res) {
        const json body = {{"object", "list"},
                           {"data",
                            {{{"id", model_id},
                              {"object", "model"},
                              {"created", created},
                              {"owned_by", "protokv"},
                              {"meta", {{"context_length", options.ctx}}}}}}};
        res.set_content(dump(body), "application/json");
      });
    }
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    for (const char* path : {"/v1/chat/completions", "/chat/completions"})
      http.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
        handle_completion(req, res, /*chat=*/true);
      });
    for (const char* path : {"/v1/completions", "/completions"})
      http.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
        handle_completion(req, res, /*chat=*/false);
      });
  }

  std::string metrics_text() const {
    const SchedulerStats s = scheduler->stats();
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, double value) {
      out += fmt::format("# HELP protokv_{0} {1}\n# TYPE protokv_{0} {2}\nprotokv_{0} {3}\n", name,
                         help, type, value);
    };
    metric("requests_total", "counter", "Requests finished, successfully or not.",
           static_cast<double>(s.requests));
    metric("requests_failed_total", "counter", "Requests that ended in an error.",
           static_cast<double>(s.requests_failed));
    metric("requests_cancelled_total", "counter", "Requests whose client went away.",
           static_cast<double>(s.requests_cancelled));
    metric("requests_rejected_total", "counter", "Requests refused with 503 (queue full).",
           static_cast<double>(s.requests_rejected));
    metric("prompt_tokens_total", "counter", "Prompt tokens prefilled.",
           static_cast<double>(s.prompt_tokens));
    metric("generated_tokens_total", "counter", "Tokens generated.",
           static_cast<double>(s.generated_tokens));
    metric("prefill_tokens_per_second", "gauge", "Prompt tokens per second of prefill, overall.",
           s.prefill_ms > 0 ? 1000.0 * static_cast<double>(s.prompt_tokens) / s.prefill_ms : 0.0);
    metric("decode_tokens_per_second", "gauge", "Decode steps per second of decode time, overall.",
           s.decode_ms > 0 ? 1000.0 * static_cast<double>(s.decode_steps) / s.decode_ms : 0.0);
    metric("compress_seconds_total", "counter", "Time spent inside the presses.",
           s.compress_ms / 1000.0);
    metric("kv_bytes_reserved", "gauge",
           "KV bytes reserved by admitted requests (what --kv-memory caps).",
           static_cast<double>(s.kv_bytes_in_use));
    metric("kv_bytes_cached", "gauge",
           "KV bytes reserved by cached conversations (part of kv_bytes_reserved; evicted when "
           "a request needs them).",
           static_cast<double>(s.kv_bytes_parked));
    metric("kv_bytes_held", "gauge", "KV bytes the active and cached sessions' caches hold.",
           static_cast<double>(s.kv_bytes_held));
    metric("kv_bytes_cap", "gauge", "--kv-memory in bytes (0: no cap).",
           static_cast<double>(s.kv_bytes_cap));
    metric("threads", "gauge", "Threads of the engine (-t).", s.engine_threads);
    metric("queue_length", "gauge", "Requests waiting for a slot or for memory.",
           static_cast<double>(s.queue_length));
    metric("active_sessions", "gauge", "Sessions prefilling or decoding.",
           static_cast<double>(s.active_sessions));
    metric("prefilling_sessions", "gauge",
           "Sessions still running their prompt (a chunk per round).",
           static_cast<double>(s.prefilling_sessions));
    metric("cached_sessions", "gauge", "Finished conversations kept for a follow-up turn.",
           static_cast<double>(s.parked_sessions));
    metric("cached_prompt_tokens_total", "counter",
           "Prompt tokens served from a cached conversation instead of being run again.",
           static_cast<double>(s.cached_prompt_tokens));
    return out;
  }

  // The job for a parsed request: its prompt tokens, press, budget and limits.
  std::shared_ptr<Job> make_job(const CompletionRequest& r) {
    auto job = std::make_shared<Job>();
    const Tokenizer& tokenizer = *model.tokenizer;
    if (r.chat) {
      if (!chat_family) throw ApiError(400, chat_error, "messages");
      job->prompt_text = render_chat(*chat_family, r.messages, /*add_generation_prompt=*/true);
      job->prompt = build_prompt(tokenizer, job->prompt_text, "", /*query_agnostic=*/false);
    } else if (!r.prompt_tokens.empty()) {
      for (int32_t id : r.prompt_tokens)
        if (id >= model.weights.config.vocab_size)
          throw ApiError(400,
                         fmt::format("token id {} is outside the vocabulary of {}", id,
                                     model.weights.config.vocab_size),
                         "prompt");
      job->prompt.prefill = r.prompt_tokens;
    } else {
      job->prompt_text = r.prompt;
      job->prompt = build_prompt(tokenizer, r.prompt, "", /*query_agnostic=*/false);
    }
    const int64_t n_prompt = job->prompt.total();
    if (n_prompt >= options.ctx)
      throw ApiError(400,
                     fmt::format("the prompt has {} tokens; this server's context is {} (--ctx)",
                                 n_prompt, options.ctx),
                     r.chat ? "messages" : "prompt", "invalid_request_error",
                     "context_length_exceeded");
    int64_t max_tokens = r.max_tokens.value_or(std::min(options.n_predict, options.ctx - n_prompt));
    if (n_prompt + max_tokens > options.ctx)
      throw ApiError(400,
                     fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds this server's "
                                 "context of {} tokens",
                                 n_prompt, max_tokens, options.ctx),
                     "max_tokens", "invalid_request_error", "context_length_exceeded");
    job->generate.max_new_tokens = static_cast<int>(max_tokens);
    job->generate.ignore_eos = r.ignore_eos;
    job->sampler = r.sampler;
    job->stop = r.stop;

    // Compression: the server's defaults, overridden field by field by "kv_compression".
    const std::string press_text = r.compression.press.value_or(options.press);
    const std::string alloc = r.compression.alloc.value_or(options.alloc);
    try {
      job->session.press = press_spec(press_text, alloc);
    } catch (const Error& e) {
      throw ApiError(400, e.what(),
                     r.compression.press ? "kv_compression.press" : "kv_compression.alloc");
    }
    Budget budget = options.budget;
    if (r.compression.budget) budget = Budget{*r.compression.budget, 0.0};
    if (r.compression.ratio) budget = Budget{0, *r.compression.ratio};
    if (job->session.press != nullptr) {
      if (!budget.is_set())
        throw ApiError(400,
                       fmt::format("press {} needs a budget: kv_compression.budget or .ratio "
                                   "(or start the server with --budget/--ratio)",
                                   press_text),
                       "kv_compression.budget");
      job->session.budget = budget;
    }
    job->cache_prompt = r.cache_prompt;
    job->compression_key = fmt::format("{}|{}|{}", press_text, budget.to_string(), alloc);
    job->session.ubatch = options.scheduler.ubatch;
    job->session.compress_local_layers = options.scheduler.compress_local_layers;
    job->session.cache_type = options.scheduler.cache_type;
    return job;
  }

  json compression_json(const Job& job, const Job::Outcome& o) const {
    json j = {{"press", job.session.press ? job.session.press->text() : "full"},
              {json_keys::kKvBytes, o.prefill.kv_bytes},
              {json_keys::kKvBytesFull, o.kv_bytes_full},
              {json_keys::kKvBytesEnd, o.kv_bytes_end},
              {"compress_ms", o.prefill.compress_ms},
              {"cache_type_k", dtype_name(job.session.cache_type.key)},
              {"cache_type_v", dtype_name(job.session.cache_type.value)}};
    j["budget"] = job.session.press ? json(job.session.budget.to_string()) : json(nullptr);
    return j;
  }

  json timings_json(const Job::Outcome& o) const {
    const double prompt_ms = o.prefill.prefill_ms;
    return {{"queue_ms", o.queue_ms},
            {"prompt_n", o.usage.prompt_tokens},
            {"prompt_ms", prompt_ms},
            {"predicted_n", o.usage.completion_tokens},
            {"predicted_ms", o.decode_ms}};
  }

  void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    std::shared_ptr<Job> job;
    CompletionRequest request;
    try {
      const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
      if (body.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
      request = parse_completion_request(body, chat);
      job = make_job(request);
      scheduler->submit(job);
    } catch (const ApiError& e) {
      send_error(res, e);
      return;
    }
    const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id++);
    const int64_t now = unix_seconds();
    if (request.stream) {
      stream(res, job, request, id, now);
      return;
    }
    std::string text;
    while (job->wait_for_output(text, 1000ms)) {
    }
    const Job::Outcome& o = job->outcome();
    if (o.error) {
      send_error(res, *o.error);
      return;
    }
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", o.finish_reason}};
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    else
      choice["text"] = text;
    const json body = {{"id", id},
                       {"object", chat ? "chat.completion" : "text_completion"},
                       {"created", now},
                       {"model", model_id},
                       {"choices", json::array({choice})},
                       {"usage", usage_json(o.usage)},
                       {"kv_compression", compression_json(*job, o)},
                       {"timings", timings_json(o)}};
    res.set_content(dump(body), "application/json");
  }

  void stream(httplib::Response& res, const std::shared_ptr<Job>& job,
              const CompletionRequest& request, const std::string& id, int64_t now) {
    const bool chat = request.chat;
    auto chunk = [this, chat, id, now](json choice_fields) {
      json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      for (auto& [k, v] : choice_fields.items()) choice[k] = v;
      return json{{"id", id},
                  {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", now},
                  {"model", model_id},
                  {"choices", json::array({choice})}};
    };
    const bool include_usage = request.include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, chunk, chat, include_usage](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& event) {
            const std::string data = "data: " + event + "\n\n";
            return sink.write(data.data(), data.size());
          };
          bool ok =
              !chat || send(dump(chunk({{"delta", {{"role", "assistant"}, {"content", ""}}}})));
          auto last_write = std::chrono::steady_clock::now();
          for (bool more = true; ok && more;) {
            std::string text;
            more = job->wait_for_output(text, 1000ms);
            if (!text.empty()) {
              ok = send(
                  dump(chat ? chunk({{"delta", {{"content", text}}}}) : chunk({{"text", text}})));
              last_write = std::chrono::steady_clock::now();
            } else if (more && std::chrono::steady_clock::now() - last_write > 1s) {
              // An SSE comment while queued or prefilling: a client that went away fails the
              // write, and its request is cancelled instead of holding memory.
              const std::string ping = ": waiting\n\n";
              ok = sink.write(ping.data(), ping.size());
              last_write = std::chrono::steady_clock::now();
            }
          }
          if (!ok) {
            job->cancel();
            return false;
          }
          const Job::Outcome& o = job->outcome();
          if (o.error) {
            send(dump(o.error->to_json()));
          } else {
            json last = chat
                            ? chunk({{"delta", json::object()}, {"finish_reason", o.finish_reason}})
                            : chunk({{"text", ""}, {"finish_reason", o.finish_reason}});
            last["kv_compression"] = compression_json(*job, o);
            last["timings"] = timings_json(o);
            send(dump(last));
            if (include_usage) {
              json usage = chunk({});
              usage["choices"] = json::array();
              usage["usage"] = usage_json(o.usage);
              send(dump(usage));
            }
          }
          send("[DONE]");
          sink.done();
          return true;
        },
        [job](bool success) {
          if (!success) job->cancel();
        });
  }
};

Server::Server(const LoadedModel& model, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, std::move(options))) {}

Server::~Server() {
  stop();
}

int Server::bind() {
  const ServerOptions& o = impl_->options;
  // cpp-httplib 0.11 sets SO_REUSEPORT on its listening socket (a second server on the same port
  // would bind too and silently take half the connections) and listens with a backlog of 5 (a
  // burst of clients overflows it: their SYNs are dropped and some connections end without a
  // response). The socket-options hook sees the socket before bind(): take SO_REUSEADDR only, and
  // listen() again below with a backlog that holds every connection the server will serve.
  impl_->http.set_socket_options([this](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    impl_->listen_socket = sock;
  });
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    PROTOKV_CHECK(port > 0, "cannot bind {} on any port", o.host);
  } else {
    PROTOKV_CHECK(impl_->http.bind_to_port(o.host, port), "cannot bind {}:{} (in use?)", o.host,
                  port);
  }
  PROTOKV_CHECK(::listen(impl_->listen_socket, SOMAXCONN) == 0, "cannot listen on {}:{}", o.host,
                port);
  return port;
}

void Server::listen() {
  impl_->listening = true;
  if (!impl_->stopping) impl_->http.listen_after_bind();
  impl_->listening = false;
}

void Server::stop() {
  impl_->stopping = true;
  impl_->scheduler->stop();
  // cpp-httplib's stop() does nothing until listen_after_bind() runs: a stop() racing a listen()
  // that has not started yet waits for it (or listen() sees `stopping` and returns at once).
  while (impl_->listening && !impl_->http.is_running()) std::this_thread::yield();
  impl_->http.stop();
}

SchedulerStats Server::stats() const {
  return impl_->scheduler->stats();
}

}  // namespace protokv::server
