// SPDX-License-Identifier: Apache-2.0
#pragma once
// The server's engine side: one thread owns the model and steps every active session. Requests
// wait in a bounded FIFO queue until a session slot (--parallel) and their KV reservation
// (--kv-memory, KvAccountant) are free; then they are prefilled (compressed by their press) and
// join the decode rounds, one token per active session per round, so a new request starts between
// two rounds instead of after the running requests.
//
// Conversations (llama-server's cache_prompt): a finished request's session is parked with its
// cache (the compressed prompt plus the tokens generated after it). A later request under the
// same compression whose prompt text starts with that session's text (its prompt and the reply
// it generated: a chat's next turn), or whose prompt ids start with its token ids, continues it:
// only the rest is encoded and run (Session::append, not compressed) instead of prefilling the
// whole history again. Text, not tokens, is matched for text prompts because the model's own
// tokens for its reply often differ from the reply re-encoded inside the next prompt. At most
// --parallel sessions stay parked, least recently used first out; parked sessions count against
// --kv-memory and are evicted when a request needs their memory.
//
// Each round runs one prompt chunk (--ubatch rows) of the oldest session still prefilling, then
// one forward pass over every decoding session's row (decode_batch): the weights are read once
// per round, not once per session, and each session attends to its own ragged, compressed cache
// with its own press. A long prompt thus delays the others by one chunk per round instead of
// its whole prefill.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "protokv/engine.h"
#include "protokv/generate.h"
#include "protokv/model.h"
#include "protokv/sampler.h"
#include "server/kv_accountant.h"
#include "server/openai_api.h"

namespace protokv::server {

// One request in flight. The HTTP thread fills the inputs and submits it, then reads its output
// with wait_for_output(); the engine thread appends output and finishes it.
struct Job {
  // --- inputs ---
  PromptTokens prompt;
  // The text `prompt` was encoded from (BOS not included); empty for a prompt given as token ids.
  std::string prompt_text;
  SessionOptions session;
  GenerateOptions generate;
  SamplerOptions sampler;
  std::vector<std::string> stop;
  // Requests may continue a parked session only under the same compression (press, budget,
  // allocator spelled out); empty never matches.
  std::string compression_key;
  bool cache_prompt = true;  // may continue a parked session, and is parked when done

  // --- outputs (engine thread writes; read through wait_for_output / after finished) ---
  struct Outcome {
    std::optional<ApiError> error;
    std::string finish_reason;  // "stop" (end of generation or a stop string) or "length"
    Usage usage;
    PrefillStats prefill;
    size_t kv_bytes_full = 0;  // what the full cache would hold for the prompt
    size_t kv_bytes_end = 0;
    double queue_ms = 0.0;
    double decode_ms = 0.0;
  };
  // Blocks until there is new text or the job has finished, or `timeout` passes; appends the new
  // text to `out`. Returns true while the job may still produce output.
  bool wait_for_output(std::string& out, std::chrono::milliseconds timeout);
  // Valid once wait_for_output has returned false.
  const Outcome& outcome() const { return outcome_; }
  // The client went away (or the server stops): the engine drops the job at its next step and
  // releases its memory.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Engine side.
  void emit(const std::string& text);
  void finish(Outcome outcome);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string pending_;
  bool finished_ = false;
  Outcome outcome_;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int parallel = 4;         // sessions decoding at once
  size_t queue_limit = 64;  // requests waiting beyond those; more get 503
  size_t kv_memory = 0;     // bytes, hard cap over all sessions; 0: none
  int64_t ubatch = 512;     // SessionOptions::ubatch: prompt rows per round (0: all at once)
  bool compress_local_layers = false;
  KvCacheType cache_type;  // every session's (--cache-type-k/-v); admission counts its bytes
  // Sleeps this long after every decode round. Tests only (not a flag): on a tiny model a request
  // finishes in milliseconds, and the queueing, 503 and disconnect tests need requests that
  // overlap.
  std::chrono::milliseconds round_delay{0};
};

// Cumulative counters for /metrics.
struct SchedulerStats {
  int64_t requests = 0;  // finished, successfully or not
  int64_t requests_failed = 0;
  int64_t requests_cancelled = 0;
  int64_t requests_rejected = 0;  // 503: queue full
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_ms = 0.0;
  double decode_ms = 0.0;
  int64_t decode_steps = 0;
  double compress_ms = 0.0;
  size_t queue_length = 0;
  size_t active_sessions = 0;        // prefilling or decoding
  size_t prefilling_sessions = 0;    // still running their prompt, a chunk per round
  size_t parked_sessions = 0;        // finished conversations kept for a follow-up turn
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from parked sessions
  size_t kv_bytes_in_use = 0;        // reserved (what admission counts)
  size_t kv_bytes_held = 0;          // held by the active and parked sessions' caches now
  size_t kv_bytes_parked = 0;        // reserved by parked sessions (their caches; part of in_use)
  size_t kv_bytes_cap = 0;
  int engine_threads = 0;  // OpenMP threads of the engine thread (0 before it starts)
};

class Scheduler {
 public:
  Scheduler(const LoadedModel& model, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues `job`. Throws ApiError: 503 when the queue is full (the client should retry), 400 when
  // the request could never fit --kv-memory, or the server is stopping.
  void submit(std::shared_ptr<Job> job);
  // Cancels every queued and active job and joins the engine thread. Idempotent.
  void stop();
  SchedulerStats stats() const;
  // The most KV bytes a request may reserve before its prefill: the full cache of its prompt
  // plus every token it may generate (an upper bound on what any press can hold).
  size_t reservation_bytes(const Job& job) const;

 private:
  struct Active;
  struct Parked;
  void run();
  // Under mutex_: whether the queue's head can start now, taking its memory (and the parked
  // session it continues, if any) into `admitted`.
  bool admit_head(std::unique_ptr<Active>& admitted);
  void start(std::unique_ptr<Active> active);
  // Runs the next prompt chunk (SchedulerOptions::ubatch rows) of the first session still
  // prefilling, so that a long prompt delays the decoding sessions by one chunk per round, not by
  // its whole prefill.
  void prefill_round();
  // Once a session's prompt is in: its reservation shrinks to what it holds, stats.
  void prefilled(Active& active);
  void step_all();
  void retire(std::unique_ptr<Active> active, Job::Outcome outcome);
  // The parked session whose tokens are a proper prefix of `job`'s prompt under the same
  // compression; parked_.end() if none.
  std::vector<std::unique_ptr<Parked>>::iterator find_parked(const Job& job);

  const LoadedModel& model_;
  const SchedulerOptions options_;
  KvAccountant accountant_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<Job>, std::chrono::steady_clock::time_point>> queue_;
  bool stopping_ = false;
  SchedulerStats stats_;  // under mutex_

  // Engine thread only (admit_head runs on it, under mutex_).
  std::vector<std::unique_ptr<Active>> active_;
  std::vector<std::unique_ptr<Parked>> parked_;  // least recently used first
  std::atomic<size_t> active_count_{0};
  std::atomic<size_t> prefilling_count_{0};
  std::atomic<size_t> parked_count_{0};
  std::atomic<size_t> kv_bytes_held_{0};
  std::atomic<size_t> kv_bytes_parked_{0};
  std::atomic<int> engine_threads_{0};
  std::thread engine_;
};

}  // namespace protokv::server
