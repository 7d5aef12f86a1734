// SPDX-License-Identifier: Apache-2.0
#include "eval/longctx_runner.h"

#include "core/text.h"
#include "eval/statistics.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "eval/memory_share.h"
#include "eval/progress.h"
#include "eval/results_file.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/json_keys.h"
#include "protokv/press_spec.h"
#include "protokv/sampler.h"
#include "protokv/timer.h"
#include "protokv/tokenizer.h"

namespace protokv::eval {

std::string LongctxRunSpec::label() const {
  if (memory_share > 0.0) return fmt::format("{}@m{:g}", press, memory_share);
  if (!budget.is_set()) return press;
  if (budget.entries > 0) return fmt::format("{}@{}", press, budget.entries);
  return fmt::format("{}@r{:g}", press, budget.ratio);
}

std::vector<LongctxRunSpec> make_run_specs(const std::vector<std::string>& presses,
                                           const std::vector<int64_t>& budgets,
                                           const std::vector<double>& ratios,
                                           const std::vector<double>& memory_shares) {
  PROTOKV_CHECK(!presses.empty(), "give at least one press");
  const size_t compressed = std::count_if(presses.begin(), presses.end(),
                                          [](const std::string& p) { return p != "full"; });
  const size_t per_press = budgets.size() + ratios.size() + memory_shares.size();
  PROTOKV_CHECK(compressed * per_press <= limits::kMaxEvalRuns,
                "{} presses x {} budgets is more than {} runs", compressed, per_press,
                limits::kMaxEvalRuns);
  for (double share : memory_shares)
    PROTOKV_CHECK(share > 0.0 && share <= 1.0, "memory share {} outside (0, 1]", share);
  std::vector<LongctxRunSpec> runs;
  bool full_added = false;
  for (const auto& press : presses) {
    // "full" keeps every entry whatever the budget: one run, no budget.
    if (press == "full") {
      if (!full_added) runs.push_back(LongctxRunSpec{});
      full_added = true;
      continue;
    }
    PROTOKV_CHECK(per_press > 0, "press {} needs at least one budget, ratio or memory share",
                  press);
    for (int64_t b : budgets) {
      LongctxRunSpec spec;
      spec.press = press;
      spec.budget.entries = b;
      runs.push_back(spec);
    }
    for (double r : ratios) {
      LongctxRunSpec spec;
      spec.press = press;
      spec.budget.ratio = r;
      runs.push_back(spec);
    }
    for (double share : memory_shares) {
      LongctxRunSpec spec;
      spec.press = press;
      spec.memory_share = share;
      runs.push_back(spec);
    }
  }
  std::set<std::string> labels;
  for (const auto& run : runs)
    PROTOKV_CHECK(labels.insert(run.label()).second, "run {} is given twice", run.label());
  return runs;
}

nlohmann::json LongctxRecord::to_json() const {
  nlohmann::json j;
  j["run"] = run;
  j["id"] = id;
  if (sample >= 0) j["sample"] = sample;
  j["prediction"] = prediction;
  j["score"] = score;
  if (!error.empty()) j["error"] = error;
  j["prompt_tokens"] = prompt_tokens;
  j["generated_tokens"] = generated_tokens;
  j["compress_ms"] = compress_ms;
  j["prefill_ms"] = prefill_ms;
  j["decode_ms"] = decode_ms;
  j[json_keys::kKvBytes] = kv_bytes;
  j[json_keys::kPeakKvBytes] = peak_kv_bytes;
  j[json_keys::kAttendedKvBytes] = attended_kv_bytes;
  if (full_kv_bytes > 0) j[json_keys::kFullKvBytes] = full_kv_bytes;
  if (budget > 0) j["budget"] = budget;
  j["meta"] = meta;
  return j;
}

LongctxRecord LongctxRecord::from_json(const nlohmann::json& j) {
  LongctxRecord r;
  r.run = j.at("run").get<std::string>();
  r.id = j.at("id").get<std::string>();
  r.sample = j.value("sample", int64_t{-1});
  r.prediction = j.value("prediction", "");
  r.score = j.value("score", 0.0);
  r.error = j.value("error", "");
  r.prompt_tokens = j.value("prompt_tokens", int64_t{0});
  r.generated_tokens = j.value("generated_tokens", int64_t{0});
  r.compress_ms = j.value("compress_ms", 0.0);
  r.prefill_ms = j.value("prefill_ms", 0.0);
  r.decode_ms = j.value("decode_ms", 0.0);
  r.kv_bytes = j.value(json_keys::kKvBytes, size_t{0});
  r.peak_kv_bytes = j.value(json_keys::kPeakKvBytes, size_t{0});
  r.attended_kv_bytes = j.value(json_keys::kAttendedKvBytes, size_t{0});
  r.full_kv_bytes = j.value(json_keys::kFullKvBytes, size_t{0});
  r.budget = j.value("budget", int64_t{0});
  r.meta = j.value("meta", nlohmann::json::object());
  r.resumed = true;
  return r;
}

nlohmann::json LongctxSummary::to_json() const {
  nlohmann::json j;
  j["run"] = run;
  j["scored"] = scored;
  j["skipped"] = skipped;
  j["score"] = mean_score;
  if (paired > 0) {
    j["paired"] = paired;
    j["diff_vs_reference"] = diff_mean;
    j["diff_ci95"] = diff_ci95;
  }
  j["compress_ms"] = compress_ms;
  j[json_keys::kKvBytes] = kv_bytes;
  j[json_keys::kPeakKvBytes] = peak_kv_bytes;
  if (!std::isnan(stored_share)) j[json_keys::kStoredShare] = stored_share;
  if (!std::isnan(attended_share)) j[json_keys::kAttendedShare] = attended_share;
  return j;
}

std::vector<LongctxSummary> summarize(const std::vector<LongctxRecord>& records,
                                      const std::vector<LongctxRunSpec>& runs,
                                      const std::string& reference,
                                      const std::function<bool(const LongctxRecord&)>& filter) {
  std::vector<std::string> labels;
  labels.reserve(runs.size());
  for (const auto& spec : runs) labels.push_back(spec.label());
  return summarize(records, labels, reference, filter);
}

std::vector<LongctxSummary> summarize(const std::vector<LongctxRecord>& records,
                                      const std::vector<std::string>& labels,
                                      const std::string& reference,
                                      const std::function<bool(const LongctxRecord&)>& filter) {
  std::map<std::string, std::map<std::string, double>> scores;  // run -> id -> score
  std::vector<LongctxSummary> out;
  for (const auto& label : labels) {
    LongctxSummary s;
    s.run = label;
    double stored = 0.0, attended = 0.0;
    int64_t n_stored = 0, n_attended = 0;
    for (const auto& r : records) {
      if (r.run != s.run || (filter && !filter(r))) continue;
      if (!r.error.empty()) {
        ++s.skipped;
        continue;
      }
      ++s.scored;
      s.mean_score += r.score;
      s.compress_ms += r.compress_ms;
      s.kv_bytes += static_cast<double>(r.kv_bytes);
      s.peak_kv_bytes += static_cast<double>(r.peak_kv_bytes);
      scores[s.run][r.id] = r.score;
      if (r.full_kv_bytes > 0) {
        const auto full = static_cast<double>(r.full_kv_bytes);
        stored += static_cast<double>(r.kv_bytes) / full;
        ++n_stored;
        if (r.attended_kv_bytes > 0) {
          attended += static_cast<double>(r.attended_kv_bytes) / full;
          ++n_attended;
        }
      }
    }
    if (n_stored > 0) s.stored_share = stored / static_cast<double>(n_stored);
    if (n_attended > 0) s.attended_share = attended / static_cast<double>(n_attended);
    if (s.scored > 0) {
      const double n = static_cast<double>(s.scored);
      s.mean_score /= n;
      s.compress_ms /= n;
      s.kv_bytes /= n;
      s.peak_kv_bytes /= n;
    }
    out.push_back(s);
  }
  if (scores.count(reference) == 0) return out;
  const auto& ref = scores[reference];
  for (auto& s : out) {
    if (s.run == reference) continue;
    std::vector<double> a, b;
    for (const auto& [id, score] : scores[s.run]) {
      const auto it = ref.find(id);
      if (it == ref.end()) continue;
      a.push_back(score);
      b.push_back(it->second);
    }
    s.paired = static_cast<int64_t>(a.size());
    const PairedDifference d = paired_difference(a, b);
    s.diff_mean = d.mean;
    s.diff_ci95 = d.half_width();
  }
  return out;
}

std::string decode_prediction(const Tokenizer& tokenizer, const std::vector<int32_t>& tokens) {
  std::string text;
  int32_t prev = -1;
  for (int32_t t : tokens) {
    if (t == tokenizer.eos_id()) break;
    if (t >= 0 && t < tokenizer.vocab_size()) text += tokenizer.decode(prev, t);
    prev = t;
  }
  return text::sanitize_utf8(text);
}

std::string format_eta(int64_t done, int64_t total, double elapsed_ms) {
  if (done <= 0 || total <= done) return done >= total ? "0s" : "?";
  const double left_s =
      elapsed_ms / 1000.0 * static_cast<double>(total - done) / static_cast<double>(done);
  const auto secs = static_cast<int64_t>(std::llround(left_s));
  if (secs >= 3600) return fmt::format("{}h{:02}m", secs / 3600, secs / 60 % 60);
  if (secs >= 60) return fmt::format("{}m{:02}s", secs / 60, secs % 60);
  return fmt::format("{}s", secs);
}

nlohmann::json longctx_results_header(std::string_view mode, std::string_view alloc,
                                      std::string_view shard, std::string_view cache_type_k,
                                      std::string_view cache_type_v) {
  nlohmann::json header = {{"mode", mode}, {"alloc", alloc}};
  if (!shard.empty()) header["shard"] = shard;
  if (cache_type_k != "f32" || cache_type_v != "f32") {
    header["cache_type_k"] = cache_type_k;
    header["cache_type_v"] = cache_type_v;
  }
  return header;
}

LongctxResult run_longctx(const ModelWeights& weights, const Tokenizer& tokenizer,
                          const std::vector<LongctxSample>& samples, const LongctxScorer& scorer,
                          const LongctxOptions& options) {
  PROTOKV_CHECK(!options.runs.empty(), "nothing to run: no press");
  PROTOKV_CHECK(!(options.resume && options.jsonl_path.empty()), "resuming needs a results file");
  const int64_t context_length = weights.config.context_length;
  const std::string mode = options.query_agnostic ? "query-agnostic" : "query-aware";
  // A cache type the model's heads cannot hold fails here, not as an error in every record.
  check_kv_cache_type(options.cache_type.key, weights.config.head_dim(), "--cache-type-k");
  check_kv_cache_type(options.cache_type.value, weights.config.head_dim(), "--cache-type-v");

  // Presses are built up front so that a bad spec fails before any work.
  std::vector<std::shared_ptr<const PressSpec>> presses;
  for (const auto& spec : options.runs) {
    if (!spec.compresses()) {
      presses.push_back(nullptr);
      continue;
    }
    if (spec.memory_share > 0.0)
      PROTOKV_CHECK(spec.memory_share <= 1.0, "memory share {} outside (0, 1]", spec.memory_share);
    else
      spec.budget.validate();
    if (spec.press_object != nullptr) {
      PROTOKV_CHECK(options.alloc.empty(),
                    "press {} carries its own allocator: give it there, not alloc '{}'", spec.press,
                    options.alloc);
      presses.push_back(spec.press_object);
      continue;
    }
    presses.push_back(PressSpec::parse(spec.press, options.alloc));
  }

  const nlohmann::json header = longctx_results_header(
      mode, options.alloc.empty() ? "default" : options.alloc, options.shard,
      dtype_name(options.cache_type.key), dtype_name(options.cache_type.value));
  std::map<std::pair<std::string, std::string>, LongctxRecord> previous;
  if (options.resume) {
    int64_t record_no = 0;
    for (const auto& j : read_results_file(options.jsonl_path, header)) {
      ++record_no;
      try {
        LongctxRecord r = LongctxRecord::from_json(j);
        auto key = std::make_pair(r.run, r.id);
        previous[key] = std::move(r);
      } catch (const nlohmann::json::exception& e) {
        fail("{} record {}: {}", options.jsonl_path, record_no, e.what());
      }
    }
  }
  std::unique_ptr<ResultsFileWriter> jsonl;
  if (!options.jsonl_path.empty())
    jsonl = std::make_unique<ResultsFileWriter>(options.jsonl_path, header, options.resume);

  auto index_of = [&](const LongctxSample& sample) {
    return sample.index >= 0 ? sample.index : static_cast<int64_t>(&sample - samples.data());
  };
  LongctxResult result;
  Timer wall;
  const int64_t total = static_cast<int64_t>(options.runs.size() * samples.size());
  int64_t computed = 0, to_compute = 0;
  for (const auto& spec : options.runs)
    for (const auto& s : samples)
      if (previous.count({spec.label(), s.id}) == 0) ++to_compute;
  Progress progress(options.progress_label, total, options.progress, options.progress_sink);
  Timer compute_timer;

  // One (run, sample) in flight: prefilled, then answered greedily until the end of generation
  // or max_new_tokens.
  struct Answer {
    LongctxRecord rec;
    std::vector<int32_t> generated;
    bool done = false;
  };
  // The next token from the logits of the last one.
  auto continue_answer = [&](Answer& a, std::span<const float> logits, int max_new_tokens) {
    a.generated.push_back(argmax(logits));
    a.done = tokenizer.is_end_of_generation(a.generated.back()) ||
             static_cast<int64_t>(a.generated.size()) >= max_new_tokens;
  };
  // Prefill (its own, or from the sample's shared prompt), the question, the first token.
  auto begin_answer = [&](size_t run_index, Session& session, const LongctxSample& sample,
                          const PrefilledPrompt* shared) {
    Answer a;
    LongctxRecord& rec = a.rec;
    const LongctxRunSpec& spec = options.runs[run_index];
    rec.run = spec.label();
    rec.id = sample.id;
    rec.sample = index_of(sample);
    rec.meta = sample.meta;
    rec.prompt_tokens = static_cast<int64_t>(sample.context.size() + sample.question.size());
    try {
      PROTOKV_CHECK(sample.error.empty(), "{}", sample.error);
      PROTOKV_CHECK(!sample.context.empty(), "empty prompt");
      const int64_t need = rec.prompt_tokens + sample.max_new_tokens;
      PROTOKV_CHECK(need <= context_length,
                    "prompt {} + {} new tokens exceeds the model's context of {} tokens",
                    rec.prompt_tokens, sample.max_new_tokens, context_length);
      rec.full_kv_bytes = full_kv_bytes(weights.config, rec.prompt_tokens, options.cache_type);
      session.reset();
      std::vector<int32_t> prefill = sample.context;
      if (!options.query_agnostic)
        prefill.insert(prefill.end(), sample.question.begin(), sample.question.end());
      std::shared_ptr<const PrefilledPrompt> own;  // a memory share's trial compressions need one
      if (spec.memory_share > 0.0) {
        auto prompt = [&]() -> const PrefilledPrompt& {
          if (shared == nullptr) {
            own = PrefilledPrompt::make(weights, prefill, 0, options.cache_type);
            shared = own.get();
          }
          return *shared;
        };
        const MemoryShareBudget solved =
            solve_memory_share(weights, presses[run_index], static_cast<int64_t>(prefill.size()),
                               prompt, spec.memory_share, options.cache_type);
        Budget budget;
        budget.entries = solved.entries;
        session.set_budget(budget);
        rec.budget = solved.entries;
      }
      std::span<const float> logits =
          shared != nullptr ? session.prefill(*shared) : session.prefill(prefill);
      const PrefillStats stats = session.prefill_stats();
      rec.compress_ms = stats.compress_ms;
      rec.prefill_ms = stats.prefill_ms;
      rec.peak_kv_bytes = stats.peak_kv_bytes;
      Timer decode_timer;
      if (options.query_agnostic) {
        // The question is appended to the compressed cache as a second chunk.
        if (!sample.question.empty()) logits = session.append(sample.question);
      }
      rec.kv_bytes = session.cache().kv_bytes();
      a.done = sample.max_new_tokens <= 0;
      if (!a.done) continue_answer(a, logits, sample.max_new_tokens);
      rec.decode_ms = decode_timer.ms();
    } catch (const Error& e) {
      rec.error = e.what();
      a.done = true;
    }
    return a;
  };
  auto fail_answer = [](Answer& a, const Error& e) {
    a.rec.error = e.what();
    a.done = true;
  };
  // Greedy decoding of one answer on its own session.
  auto answer_alone = [&](Answer& a, Session& session, int max_new_tokens) {
    while (!a.done) {
      const Timer step_timer;
      try {
        continue_answer(a, session.decode(a.generated.back()), max_new_tokens);
      } catch (const Error& e) {
        fail_answer(a, e);
      }
      a.rec.decode_ms += step_timer.ms();
    }
  };
  // Scores, records and reports a finished answer.
  auto finish_answer = [&](Answer& a, const Session& session, const LongctxSample& sample) {
    LongctxRecord& rec = a.rec;
    if (rec.error.empty()) {
      if (a.generated.size() > 1)
        rec.attended_kv_bytes = session.prefill_stats().decode_attended_kv_bytes;
      rec.generated_tokens = static_cast<int64_t>(a.generated.size());
      try {  // a prediction the scorer cannot score skips this record, not the run
        rec.prediction = decode_prediction(tokenizer, a.generated);
        rec.score = scorer(sample, rec.prediction);
      } catch (const Error& e) {
        rec.error = e.what();
      }
    }
    if (!rec.error.empty()) rec.score = 0.0;
    if (jsonl) jsonl->append(rec.to_json());
    ++computed;
    progress.advance(1, fmt::format("{}  ETA {}", rec.run,
                                    format_eta(computed, to_compute, compute_timer.ms())));
    return std::move(rec);
  };

  std::vector<std::unique_ptr<Session>> sessions;
  for (size_t run_index = 0; run_index < options.runs.size(); ++run_index) {
    SessionOptions session_options;
    session_options.press = presses[run_index];
    session_options.budget = options.runs[run_index].budget;
    session_options.cache_type = options.cache_type;
    sessions.push_back(std::make_unique<Session>(weights, session_options));
  }
  // Records in run-major order whatever the order of computation.
  std::vector<std::vector<LongctxRecord>> by_run(options.runs.size());
  auto resumed = [&](size_t run_index, const LongctxSample& sample) {
    const std::string label = options.runs[run_index].label();
    auto it = previous.find({label, sample.id});
    if (it == previous.end()) return false;
    by_run[run_index].push_back(it->second);
    by_run[run_index].back().sample = index_of(sample);  // records written before it was kept
    progress.advance(1, label + " (resumed)");
    return true;
  };
  if (options.share_prefill || options.batch_decode) {
    // Sample by sample: with share_prefill its prompt runs through the model once and every run
    // compresses a copy of it (PrefilledPrompt: bit-identical to prefilling per run); with
    // batch_decode the runs' answers advance together, one decode_batch per step (each session's
    // logits bit-identical to its own decode, the weights read once per step for all).
    for (const auto& sample : samples) {
      std::shared_ptr<const PrefilledPrompt> shared;
      std::vector<size_t> run_of;  // answers[k] belongs to run run_of[k]
      std::vector<Answer> answers;
      for (size_t run_index = 0; run_index < options.runs.size(); ++run_index) {
        if (resumed(run_index, sample)) continue;
        if (options.share_prefill && shared == nullptr && sample.error.empty() &&
            !sample.context.empty()) {
          std::vector<int32_t> prompt = sample.context;
          if (!options.query_agnostic)
            prompt.insert(prompt.end(), sample.question.begin(), sample.question.end());
          if (static_cast<int64_t>(prompt.size()) + sample.max_new_tokens <= context_length)
            shared = PrefilledPrompt::make(weights, prompt, 0, options.cache_type);
        }
        Session& session = *sessions[run_index];
        Answer a = begin_answer(run_index, session, sample, shared.get());
        if (!options.batch_decode) {
          answer_alone(a, session, sample.max_new_tokens);
          by_run[run_index].push_back(finish_answer(a, session, sample));
          continue;
        }
        run_of.push_back(run_index);
        answers.push_back(std::move(a));
      }
      for (;;) {  // batch_decode: one step of every unfinished answer
        std::vector<size_t> active;
        std::vector<Session*> batch;
        std::vector<int32_t> tokens;
        for (size_t k = 0; k < answers.size(); ++k) {
          if (answers[k].done) continue;
          active.push_back(k);
          batch.push_back(sessions[run_of[k]].get());
          tokens.push_back(answers[k].generated.back());
        }
        if (active.empty()) break;
        const Timer step_timer;
        try {
          const std::vector<std::span<const float>> logits = decode_batch(batch, tokens);
          for (size_t i = 0; i < active.size(); ++i)
            continue_answer(answers[active[i]], logits[i], sample.max_new_tokens);
        } catch (const Error& e) {  // the batch's sessions are reset: each answer fails
          for (size_t k : active) fail_answer(answers[k], e);
        }
        const double step_ms = step_timer.ms();
        for (size_t k : active) answers[k].rec.decode_ms += step_ms;
      }
      for (size_t k = 0; k < answers.size(); ++k)
        by_run[run_of[k]].push_back(finish_answer(answers[k], *sessions[run_of[k]], sample));
    }
  } else {
    for (size_t run_index = 0; run_index < options.runs.size(); ++run_index)
      for (const auto& sample : samples) {
        if (resumed(run_index, sample)) continue;
        Session& session = *sessions[run_index];
        Answer a = begin_answer(run_index, session, sample, nullptr);
        answer_alone(a, session, sample.max_new_tokens);
        by_run[run_index].push_back(finish_answer(a, session, sample));
      }
  }
  for (auto& records : by_run)
    for (auto& rec : records) result.records.push_back(std::move(rec));
  progress.finish();
  result.wall_ms = wall.ms();
  return result;
}

}  // namespace protokv::eval
