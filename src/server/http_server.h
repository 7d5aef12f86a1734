// SPDX-License-Identifier: Apache-2.0
#pragma once
// `protokv serve`: the OpenAI-compatible HTTP front end (cpp-httplib) over the Scheduler.
// Endpoints: POST /v1/chat/completions, POST /v1/completions (both with "stream": true as
// server-sent events ending in "data: [DONE]"), GET /v1/models, GET /health, GET /metrics
// (Prometheus text). Routes are also served without the /v1 prefix, as llama-server does.
#include <cstdint>
#include <memory>
#include <string>

#include "protokv/limits.h"
#include "protokv/model.h"
#include "protokv/press.h"
#include "protokv/press_spec.h"
#include "server/scheduler.h"

namespace protokv::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (bind() says which)
  std::string api_key;
  std::string model_alias;    // the id /v1/models reports; empty: the model file's name
  std::string chat_template;  // family name; empty: detected from the model's template
  // Default compression; a request's "kv_compression" object overrides any of these.
  std::string press = "full";
  Budget budget;
  std::string alloc;
  int64_t n_predict = 1024;  // max_tokens when a request leaves it out
  int64_t ctx = 0;           // prompt + max_tokens limit per request; 0: the model's context
  size_t max_body_bytes = limits::kDefaultMaxRequestBodyBytes;
  SchedulerOptions scheduler;
};

class Server {
 public:
  // Validates the options (Error with one line for a bad press, budget, template or limit).
  Server(const LoadedModel& model, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port; returns the port. Throws Error when it cannot bind.
  int bind();
  // Serves until stop() (from another thread or a signal handler thread). Blocks.
  void listen();
  // Cancels in-flight requests (their clients get an error), then stops listening.
  void stop();
  SchedulerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace protokv::server
