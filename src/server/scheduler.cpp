// SPDX-License-Identifier: Apache-2.0
#include "server/scheduler.h"

#include <fmt/format.h>

#include <algorithm>

#include "protokv/error.h"
#include "protokv/limits.h"
#include "protokv/threads.h"
#include "protokv/timer.h"
#include "protokv/tokenizer.h"

namespace protokv::server {

bool Job::wait_for_output(std::string& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !pending_.empty(); });
  out += pending_;
  pending_.clear();
  return !finished_;
}

void Job::emit(const std::string& text) {
  if (text.empty()) return;
  {
    std::lock_guard lock(mutex_);
    pending_ += text;
  }
  cv_.notify_all();
}

void Job::finish(Outcome outcome) {
  {
    std::lock_guard lock(mutex_);
    outcome_ = std::move(outcome);
    finished_ = true;
  }
  cv_.notify_all();
}

namespace {
// Whether `prefix` is a proper prefix of `ids`.
bool token_prefix(const std::vector<int32_t>& prefix, const std::vector<int32_t>& ids) {
  return prefix.size() < ids.size() && std::equal(prefix.begin(), prefix.end(), ids.begin());
}
}  // namespace

// A session with its memory: decoding a job (Active) or parked after one (Parked).
struct Scheduler::Parked {
  std::unique_ptr<Session> session;
  KvAccountant::Reservation reservation;
  std::vector<int32_t> tokens;  // every token the cache holds, in order
  std::string text;             // their text (BOS excluded); empty for a prompt of token ids
  std::string compression_key;
};

// A job admitted by the engine: prefilled (or continued) by start(), then stepped.
struct Scheduler::Active {
  std::shared_ptr<Job> job;
  Parked state;                // the session, its reservation and the tokens it holds
  std::vector<int32_t> fresh;  // tokens still to run: the whole prompt, or what a parked
                               // session lacks of it
  Sampler sampler;
  std::optional<Generation> generation;
  std::vector<size_t> piece_end;  // end of each generated token's piece in the result's text
  Utf8StreamBuffer utf8;          // a streamed piece never ends inside a UTF-8 character
  StopMatcher stop;
  bool prefilling = false;  // its prompt is still going in, a chunk per round
  Job::Outcome outcome;

  explicit Active(std::shared_ptr<Job> j)
      : job(std::move(j)), sampler(job->sampler), stop(job->stop) {}
};

Scheduler::Scheduler(const LoadedModel& model, SchedulerOptions options)
    : model_(model), options_(options), accountant_(options.kv_memory) {
  PROTOKV_CHECK(options_.parallel >= 1 && options_.parallel <= limits::kMaxParallelSessions,
                "--parallel must be in 1..{}, got {}", limits::kMaxParallelSessions,
                options_.parallel);
  PROTOKV_CHECK(model_.tokenizer != nullptr, "the server needs a model with a tokenizer");
  stats_.kv_bytes_cap = options_.kv_memory;
  // OpenMP's thread count is per thread: the engine thread takes the caller's (-t).
  engine_ = std::thread([this, threads = num_threads()] {
    set_threads(threads);
    engine_threads_ = num_threads();
    run();
  });
}

Scheduler::~Scheduler() {
  stop();
}

size_t Scheduler::reservation_bytes(const Job& job) const {
  return full_kv_bytes(model_.weights.config, job.prompt.total() + job.generate.max_new_tokens,
                       options_.cache_type);
}

void Scheduler::submit(std::shared_ptr<Job> job) {
  const size_t bytes = reservation_bytes(*job);
  if (!accountant_.could_fit(bytes))
    throw ApiError(
        400,
        fmt::format("this request may need {} bytes of KV cache before compression "
                    "(prompt {} tokens + max_tokens {}), more than the server's "
                    "--kv-memory of {} bytes: shorten it or lower max_tokens",
                    bytes, job->prompt.total(), job->generate.max_new_tokens, accountant_.cap()),
        "max_tokens");
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw ApiError(503, "the server is shutting down", "", "unavailable_error");
    if (queue_.size() >= options_.queue_limit) {
      ++stats_.requests_rejected;
      throw ApiError(
          503, fmt::format("the server is busy ({} requests queued); retry later", queue_.size()),
          "", "unavailable_error");
    }
    queue_.emplace_back(std::move(job), std::chrono::steady_clock::now());
  }
  cv_.notify_all();
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !engine_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (engine_.joinable()) engine_.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  SchedulerStats s = stats_;
  s.queue_length = queue_.size();
  s.active_sessions = active_count_;
  s.prefilling_sessions = prefilling_count_;
  s.parked_sessions = parked_count_;
  s.engine_threads = engine_threads_;
  s.kv_bytes_in_use = accountant_.in_use();
  s.kv_bytes_held = kv_bytes_held_;
  s.kv_bytes_parked = kv_bytes_parked_;
  return s;
}

std::vector<std::unique_ptr<Scheduler::Parked>>::iterator Scheduler::find_parked(const Job& job) {
  if (!job.cache_prompt || job.compression_key.empty() || !job.prompt.fed_after.empty())
    return parked_.end();
  const std::vector<int32_t>& ids = job.prompt.prefill;
  const std::string& text = job.prompt_text;
  return std::find_if(parked_.begin(), parked_.end(), [&](const std::unique_ptr<Parked>& p) {
    return p->compression_key == job.compression_key &&
           (token_prefix(p->tokens, ids) ||
            (!text.empty() && !p->text.empty() && p->text.size() < text.size() &&
             text.starts_with(p->text)));
  });
}

bool Scheduler::admit_head(std::unique_ptr<Active>& admitted) {
  const std::shared_ptr<Job>& job = queue_.front().first;
  const size_t per_token = full_kv_bytes(model_.weights.config, 1, options_.cache_type);
  auto candidate = std::make_unique<Active>(job);
  auto parked = find_parked(*job);
  // Evicts parked sessions (least recently used first, never `keep`) until `fits` holds.
  auto evict_until = [&](auto fits, const Parked* keep) {
    while (!fits()) {
      auto victim = std::find_if(parked_.begin(), parked_.end(),
                                 [&](const std::unique_ptr<Parked>& p) { return p.get() != keep; });
      if (victim == parked_.end()) return false;
      parked_.erase(victim);  // the session and its reservation go with it
    }
    return true;
  };
  std::vector<int32_t> fresh;  // what a parked session lacks of the prompt
  if (parked != parked_.end()) {
    const Parked& p = **parked;
    if (token_prefix(p.tokens, job->prompt.prefill))
      fresh.assign(job->prompt.prefill.begin() + static_cast<std::ptrdiff_t>(p.tokens.size()),
                   job->prompt.prefill.end());
    else
      fresh = model_.tokenizer->encode(std::string_view(job->prompt_text).substr(p.text.size()),
                                       /*add_bos=*/false);
    if (fresh.empty() ||
        p.session->n_past() + static_cast<int64_t>(fresh.size()) + job->generate.max_new_tokens >
            model_.weights.config.context_length)
      parked = parked_.end();  // nothing to run, or no room: start afresh
  }
  if (parked != parked_.end()) {
    // Continue: the session's memory plus room for the new tokens and the reply.
    Parked* p = parked->get();
    const size_t more =
        per_token * (fresh.size() + static_cast<size_t>(job->generate.max_new_tokens));
    const size_t need = p->session->cache().kv_bytes() + more;
    const bool fits = evict_until(
        [&] { return p->reservation.resize(std::max(need, p->reservation.bytes())); }, p);
    parked = std::find_if(parked_.begin(), parked_.end(),
                          [&](const std::unique_ptr<Parked>& q) { return q.get() == p; });
    // Too big to continue even alone: drop it and start afresh (a fresh reservation always fits
    // once nothing else is held: submit() checked that).
    if (!fits) parked_.erase(parked);
    parked = fits ? parked : parked_.end();
  }
  if (parked != parked_.end()) {
    candidate->state = std::move(**parked);
    parked_.erase(parked);
    candidate->fresh = std::move(fresh);
    candidate->outcome.usage.cached_tokens = static_cast<int64_t>(candidate->state.tokens.size());
  } else {
    // Evict cached conversations only when that makes the request fit; while active sessions
    // hold the memory it needs, it waits and the cached ones stay.
    size_t parked_bytes = 0;
    for (const auto& p : parked_) parked_bytes += p->reservation.bytes();
    const size_t need = reservation_bytes(*job);
    if (accountant_.cap() != 0 && accountant_.in_use() - parked_bytes + need > accountant_.cap())
      return false;
    std::optional<KvAccountant::Reservation> r;
    if (!evict_until(
            [&] { return (r = accountant_.try_reserve(reservation_bytes(*job))).has_value(); },
            nullptr))
      return false;
    candidate->state.reservation = std::move(*r);
    candidate->state.session = std::make_unique<Session>(model_.weights, job->session);
  }
  candidate->state.compression_key = job->compression_key;
  candidate->outcome.queue_ms = std::chrono::duration<double, std::milli>(
                                    std::chrono::steady_clock::now() - queue_.front().second)
                                    .count();
  parked_count_ = parked_.size();
  queue_.pop_front();
  admitted = std::move(candidate);
  return true;
}

void Scheduler::run() {
  const auto shutting_down = [] {
    Job::Outcome o;
    o.error = ApiError(503, "the server is shutting down", "", "unavailable_error");
    return o;
  };
  for (;;) {
    std::unique_ptr<Active> admitted;
    std::vector<std::shared_ptr<Job>> dropped;  // cancelled while queued
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] {
        return stopping_ || !active_.empty() ||
               (!queue_.empty() && active_.size() < static_cast<size_t>(options_.parallel));
      });
      if (stopping_) {
        for (auto& [job, since] : queue_) job->finish(shutting_down());
        queue_.clear();
        break;
      }
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->first->cancelled()) {
          dropped.push_back(std::move(it->first));
          it = queue_.erase(it);
          ++stats_.requests;
          ++stats_.requests_cancelled;
        } else {
          ++it;
        }
      }
      // FIFO: the head of the queue waits for memory rather than being overtaken.
      if (!queue_.empty() && active_.size() < static_cast<size_t>(options_.parallel))
        admit_head(admitted);
    }
    for (auto& job : dropped) {
      Job::Outcome o;
      o.error = ApiError(499, "cancelled by the client", "", "cancelled");
      job->finish(std::move(o));
    }
    if (admitted) start(std::move(admitted));
    prefill_round();
    step_all();
    if (options_.round_delay.count() > 0) std::this_thread::sleep_for(options_.round_delay);
  }
  while (!active_.empty()) {
    std::unique_ptr<Active> a = std::move(active_.back());
    active_.pop_back();
    retire(std::move(a), shutting_down());
  }
  parked_.clear();
  active_count_ = 0;
  parked_count_ = 0;
  kv_bytes_held_ = 0;
  kv_bytes_parked_ = 0;
}

void Scheduler::start(std::unique_ptr<Active> active) {
  const ModelConfig& config = model_.weights.config;
  Job& job = *active->job;
  active->outcome.usage.prompt_tokens = job.prompt.total();
  active->outcome.kv_bytes_full = full_kv_bytes(config, job.prompt.total(), options_.cache_type);
  active->generation.emplace(*active->state.session, *model_.tokenizer, active->sampler,
                             job.generate);
  try {
    if (active->outcome.usage.cached_tokens > 0) {
      active->generation->continue_with(active->fresh);
      active->state.tokens.insert(active->state.tokens.end(), active->fresh.begin(),
                                  active->fresh.end());
    } else {
      // Chunk by chunk, one chunk per round (prefill_round), between the decode rounds.
      active->generation->begin(job.prompt);
      active->prefilling = true;
      active->state.tokens = job.prompt.prefill;
      active->state.tokens.insert(active->state.tokens.end(), job.prompt.fed_after.begin(),
                                  job.prompt.fed_after.end());
    }
    active->state.text = job.prompt_text;
  } catch (const Error& e) {  // a prompt the model cannot take (checked by the handler too)
    Job::Outcome o = std::move(active->outcome);
    o.error = ApiError(400, e.what(), "prompt");
    retire(std::move(active), std::move(o));
    return;
  }
  if (!active->prefilling) prefilled(*active);
  active_.push_back(std::move(active));
  active_count_ = active_.size();
}

void Scheduler::prefill_round() {
  auto it = std::find_if(active_.begin(), active_.end(),
                         [](const std::unique_ptr<Active>& a) { return a->prefilling; });
  if (it == active_.end() || (*it)->job->cancelled()) return;  // step_all drops the cancelled
  Active& a = **it;
  try {
    if (!a.generation->advance_prefill()) return;
  } catch (const Error& e) {
    Job::Outcome o = std::move(a.outcome);
    o.error = ApiError(500, e.what(), "", "server_error");
    retire(std::move(*it), std::move(o));
    active_.erase(it);
    active_count_ = active_.size();
    return;
  }
  a.prefilling = false;
  prefilled(a);
}

void Scheduler::prefilled(Active& active) {
  const ModelConfig& config = model_.weights.config;
  const Job& job = *active.job;
  const GenerateResult& r = active.generation->result();
  active.outcome.prefill = r.prefill;
  // What the compressed cache holds now plus every token still to come: the reservation shrinks
  // from the full prompt's bound to this, and the freed bytes admit the next request.
  const size_t growth = full_kv_bytes(config, 1, options_.cache_type) *
                        static_cast<size_t>(job.generate.max_new_tokens);
  KvAccountant::Reservation& reservation = active.state.reservation;
  reservation.resize(
      std::min(reservation.bytes(), active.state.session->cache().kv_bytes() + growth));
  std::lock_guard lock(mutex_);
  stats_.prompt_tokens += active.outcome.usage.cached_tokens > 0
                              ? static_cast<int64_t>(active.fresh.size())
                              : job.prompt.total();
  stats_.cached_prompt_tokens += active.outcome.usage.cached_tokens;
  stats_.prefill_ms += r.prefill.prefill_ms + r.question_ms;
  stats_.compress_ms += r.prefill.compress_ms;
}

void Scheduler::retire(std::unique_ptr<Active> active, Job::Outcome outcome) {
  Parked& state = active->state;
  outcome.kv_bytes_end = state.session ? state.session->cache().kv_bytes() : 0;
  const bool park = !outcome.error && active->job->cache_prompt && state.session &&
                    !state.compression_key.empty();
  {
    std::lock_guard lock(mutex_);
    ++stats_.requests;
    if (outcome.error && outcome.error->status() == 499)
      ++stats_.requests_cancelled;
    else if (outcome.error)
      ++stats_.requests_failed;
    if (park) {
      // The tokens the cache holds: the prompt's, then the generated ones that were run (the
      // last sampled token is not, unless generation went on after it).
      const GenerateResult& r = active->generation->result();
      const auto held = static_cast<size_t>(state.session->n_past());
      size_t run = 0;
      for (; state.tokens.size() < held && run < r.tokens.size(); ++run)
        state.tokens.push_back(r.tokens[run]);
      if (!state.text.empty() && run > 0)
        state.text += r.text.substr(0, active->piece_end[run - 1]);
      state.reservation.resize(state.session->cache().kv_bytes());
      parked_.push_back(std::make_unique<Parked>(std::move(state)));
      if (parked_.size() > static_cast<size_t>(options_.parallel)) parked_.erase(parked_.begin());
      parked_count_ = parked_.size();
    }
  }
  // Only a parked state was moved (into parked_, which keeps its cache and reservation); clang-tidy
  // does not follow `park` and reports a use after move here.
  if (!park) {
    // NOLINTNEXTLINE(bugprone-use-after-move)
    if (state.session) state.session->reset();  // frees the cache now
    state.reservation.release();
  }
  active->job->finish(std::move(outcome));
}

void Scheduler::step_all() {
  size_t held = 0;
  for (auto& slot : active_) {
    if (!slot->job->cancelled()) continue;
    Job::Outcome o = std::move(slot->outcome);
    o.error = ApiError(499, "cancelled by the client", "", "cancelled");
    retire(std::move(slot), std::move(o));
  }
  std::erase(active_, nullptr);

  // One forward pass over every session whose last token still needs one: the weights are read
  // once for the whole round (decode_batch).
  std::vector<Session*> sessions;
  std::vector<int32_t> tokens;
  std::vector<Active*> forwarded;
  for (auto& slot : active_) {
    if (slot->prefilling || !slot->generation->forward_pending()) continue;
    sessions.push_back(slot->state.session.get());
    tokens.push_back(slot->generation->last_token());
    forwarded.push_back(slot.get());
  }
  if (!sessions.empty()) {
    const Timer round;
    try {
      const std::vector<std::span<const float>> logits = decode_batch(sessions, tokens);
      const double ms = round.ms();
      for (size_t i = 0; i < forwarded.size(); ++i)
        forwarded[i]->generation->forwarded(logits[i], ms);
      std::lock_guard lock(mutex_);
      stats_.decode_steps += static_cast<int64_t>(sessions.size());
      stats_.decode_ms += ms;
    } catch (const Error& e) {  // decode_batch has reset the sessions it was given
      for (auto& slot : active_) {
        if (std::find(forwarded.begin(), forwarded.end(), slot.get()) == forwarded.end()) continue;
        Job::Outcome o = std::move(slot->outcome);
        o.error = ApiError(500, e.what(), "", "server_error");
        retire(std::move(slot), std::move(o));
      }
      std::erase(active_, nullptr);
    }
  }

  for (auto& slot : active_) {
    Active& a = *slot;
    if (a.prefilling) {
      held += a.state.session->cache().kv_bytes();
      continue;
    }
    std::string text;
    Generation& generation = *a.generation;
    const bool more = generation.step([&](int32_t, std::string_view piece) {
      a.piece_end.push_back(generation.result().text.size());
      text = a.stop.push(a.utf8.push(piece));
    });
    if (more) {
      std::lock_guard lock(mutex_);
      ++stats_.generated_tokens;
    }
    a.job->emit(text);
    if (more && !a.stop.stopped() && !generation.finished()) {
      held += a.state.session->cache().kv_bytes();
      continue;
    }
    const GenerateResult& r = generation.result();
    Job::Outcome o = std::move(a.outcome);
    if (!a.stop.stopped()) a.job->emit(a.stop.push(a.utf8.flush()) + a.stop.flush());
    o.finish_reason = a.stop.stopped() || r.stopped == StopReason::kEos ? "stop" : "length";
    o.usage.completion_tokens = static_cast<int64_t>(r.tokens.size());
    o.decode_ms = r.decode_ms;
    retire(std::move(slot), std::move(o));
  }
  std::erase(active_, nullptr);
  active_count_ = active_.size();
  prefilling_count_ = static_cast<size_t>(
      std::count_if(active_.begin(), active_.end(),
                    [](const std::unique_ptr<Active>& a) { return a->prefilling; }));
  size_t parked = 0;
  for (const auto& p : parked_) {
    held += p->session->cache().kv_bytes();
    parked += p->reservation.bytes();
  }
  kv_bytes_held_ = held;
  kv_bytes_parked_ = parked;
  parked_count_ = parked_.size();  // admit_head may have evicted some
}

}  // namespace protokv::server
