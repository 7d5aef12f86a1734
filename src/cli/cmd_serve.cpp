// SPDX-License-Identifier: Apache-2.0
// `protokv serve`: the OpenAI-compatible HTTP server (src/server/). Flags are named like
// llama-server's where they mean the same thing (-m, --host, --port, -t, --parallel (llama-server:
// -np), -c/--ctx, -n/--n-predict, --api-key, --chat-template, --alias, --ubatch).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "protokv/error.h"
#include "protokv/limits.h"
#include "protokv/threads.h"
#include "server/http_server.h"

namespace protokv::cli {
namespace {

struct ServeArgs {
  ModelOptions model;
  PressOptions press;
  server::ServerOptions server;
  double kv_memory_mib = 0.0;
  size_t queue = 64;
  double max_body_mib = static_cast<double>(limits::kDefaultMaxRequestBodyBytes >> 20);
};

void run_serve(ServeArgs& a) {
  PROTOKV_CHECK(a.press.mode == "query-aware",
                "--mode: the server compresses the whole prompt (query-aware) only");
  const PressSetup setup = make_press_setup(a.press);  // validates press, budget and alloc
  PROTOKV_CHECK(a.kv_memory_mib >= 0 && a.kv_memory_mib <= 1e9,
                "--kv-memory must be a number of MiB in [0, 1e9], got {}", a.kv_memory_mib);
  constexpr double kMaxBodyMib = static_cast<double>(limits::kMaxRequestBodyBytes >> 20);
  PROTOKV_CHECK(a.max_body_mib > 0 && a.max_body_mib <= kMaxBodyMib,
                "--max-body must be in (0, {}] MiB, got {}", kMaxBodyMib, a.max_body_mib);
  PROTOKV_CHECK(a.queue >= 1 && a.queue <= 100000, "--queue must be in 1..100000, got {}", a.queue);
  PROTOKV_CHECK(a.server.scheduler.parallel >= 1 &&
                    a.server.scheduler.parallel <= limits::kMaxParallelSessions,
                "--parallel must be in 1..{}, got {}", limits::kMaxParallelSessions,
                a.server.scheduler.parallel);
  check_ubatch(a.server.scheduler.ubatch);
  a.server.press = setup.press ? setup.press->text() : "full";
  a.server.budget = setup.budget;
  a.server.alloc = setup.alloc;
  a.server.scheduler.cache_type = setup.cache_type;
  a.server.scheduler.kv_memory = static_cast<size_t>(a.kv_memory_mib * 1024.0 * 1024.0);
  a.server.scheduler.queue_limit = a.queue;
  a.server.max_body_bytes = static_cast<size_t>(a.max_body_mib * 1024.0 * 1024.0);

  const LoadedModel model = load_model_from_options(a.model, /*require_tokenizer=*/true);
  // SIGINT/SIGTERM are taken by one thread (sigwait) that stops the server; every other thread,
  // the engine's and httplib's included, inherits the blocked mask. A client that disconnects
  // must not kill the process through SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  server::Server server(model, a.server);
  const int port = server.bind();
  std::fprintf(stderr,
               "protokv serve: listening on http://%s:%d (model %s, press %s, %d parallel, "
               "kv-memory %s, %d threads)\n",
               a.server.host.c_str(), port, model.path.c_str(), a.server.press.c_str(),
               a.server.scheduler.parallel,
               a.server.scheduler.kv_memory
                   ? format_bytes(static_cast<double>(a.server.scheduler.kv_memory), 2).c_str()
                   : "unlimited",
               num_threads());
  std::fflush(stderr);
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig != 0) std::fprintf(stderr, "protokv serve: signal %d, stopping\n", sig);
    server.stop();
  });
  server.listen();
  server.stop();
  // Wakes sigwait if listen ended alone: SIGTERM is in the thread's wait set, so it is received,
  // not delivered (the thread returns from sigwait and ends; nothing is terminated).
  // NOLINTNEXTLINE(bugprone-bad-signal-to-kill-thread)
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health, "
      "/metrics) whose KV cache is compressed per request; see docs/server.md");
  add_model_options(*cmd, a->model);
  add_press_options(*cmd, a->press);
  auto& s = a->server;
  cmd->add_option("--host", s.host, "Address to bind (default 127.0.0.1: this machine only)")
      ->capture_default_str();
  cmd->add_option("--port", s.port, "Port (0: any free one, printed at start)")
      ->capture_default_str();
  cmd->add_option("--parallel,--np", s.scheduler.parallel, "Sessions decoding at once")
      ->capture_default_str();
  cmd->add_option("--queue", a->queue,
                  "Requests that may wait for a slot or for KV memory; more get 503 + Retry-After")
      ->capture_default_str();
  cmd->add_option("-c,--ctx", s.ctx,
                  "Longest prompt + max_tokens per request (0: the model's context)")
      ->capture_default_str();
  cmd->add_option("-n,--n-predict", s.n_predict, "max_tokens when a request leaves it out")
      ->capture_default_str();
  cmd->add_option("--kv-memory", a->kv_memory_mib,
                  "Hard cap on KV-cache MiB over all sessions (0: none). A request is admitted "
                  "when its prompt's full cache plus max_tokens fits; after prefill it holds "
                  "only its compressed cache plus room for its tokens")
      ->capture_default_str();
  cmd->add_option("--api-key", s.api_key,
                  "Require 'Authorization: Bearer KEY' on every endpoint but /health");
  cmd->add_option("--chat-template", s.chat_template,
                  "Chat template family (chatml, llama3, gemma, ...; default: detected)");
  cmd->add_option("--alias", s.model_alias, "Model id reported by /v1/models (default: file name)");
  cmd->add_option("--max-body", a->max_body_mib, "Largest request body in MiB (413 beyond)")
      ->capture_default_str();
  add_ubatch_option(*cmd, s.scheduler.ubatch);
  cmd->add_flag("--compress-local-layers", s.scheduler.compress_local_layers,
                "Models with sliding-window layers (Gemma 3): compress those too");
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace protokv::cli
