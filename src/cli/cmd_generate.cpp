// SPDX-License-Identifier: Apache-2.0
// `protokv generate`: prefill a prompt (compressing the KV cache with a press), then sample,
// through the library's generate() (protokv/generate.h). stdout carries only the generated text,
// streamed token by token; the summary goes to stderr.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "eval/memory_share.h"
#include "io/npy.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/generate.h"
#include "protokv/json_keys.h"
#include "protokv/memory.h"
#include "protokv/sampler.h"
#include "protokv/threads.h"
#include "protokv/timer.h"
#include "protokv/tokenizer.h"

namespace protokv::cli {
namespace {

struct GenerateArgs {
  ModelOptions model;
  PressOptions press;
  double memory_share = 0.0;  // --kv-memory-share: solve the budget per prompt (0: off)
  SamplerOptions sampler;
  std::string prompt;
  std::string prompt_file;
  std::string question;
  int n_predict = 256;
  int64_t ubatch = 0;
  bool llama_cpp_arithmetic = false;
  bool llama_cpp_flash_attention = false;
  int llama_cpp_threads = 1;
  bool compress_local_layers = false;
  bool json = false;
  bool kv_positions = false;  // with --json: the kept positions per layer and KV head
  std::string logits_out;     // .npy of the logits each generated token was sampled from
  bool ignore_eos = false;
  bool chat = false;
  std::string system;
  std::string chat_template;  // family name; empty: detect from the model's template
};

// The context text: -p, -f, or none (generation then starts right after BOS).
std::string context_text(const GenerateArgs& o, const CLI::App& cmd) {
  if (cmd.count("--prompt") > 0) {
    PROTOKV_CHECK(!o.prompt.empty(), "empty prompt: -p was given an empty string");
    return o.prompt;
  }
  if (cmd.count("--file") > 0) {
    std::string text = read_text_file(o.prompt_file);
    PROTOKV_CHECK(!text.empty(), "empty prompt: {} is empty", o.prompt_file);
    return text;
  }
  return "";
}

void write_stdout(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

void run_generate(const GenerateArgs& o, const CLI::App& cmd) {
  PROTOKV_CHECK(o.n_predict >= 0, "-n must be >= 0, got {}", o.n_predict);
  PROTOKV_CHECK(!o.kv_positions || o.json, "--kv-positions needs --json");
  check_ubatch(o.ubatch);
  Sampler sampler(o.sampler);  // validates the sampler options
  PressOptions press_options = o.press;
  if (o.memory_share != 0.0) {
    PROTOKV_CHECK(o.memory_share > 0.0 && o.memory_share <= 1.0,
                  "--kv-memory-share must be in (0, 1], got {}", o.memory_share);
    PROTOKV_CHECK(o.press.budget == 0 && o.press.ratio == 0.0,
                  "give either --kv-memory-share or --budget/--ratio, not both");
    PROTOKV_CHECK(!o.compress_local_layers,
                  "--kv-memory-share solves the budget of the global layers' press: not with "
                  "--compress-local-layers");
    press_options.ratio = o.memory_share;  // validates the press; the solved budget replaces it
  }
  PressSetup setup = make_press_setup(press_options);
  std::string context = context_text(o, cmd);
  if (!o.logits_out.empty()) {  // fail before generating, not after
    FILE* probe = std::fopen(o.logits_out.c_str(), "wb");
    PROTOKV_CHECK(probe != nullptr, "--logits-out: cannot write {}", o.logits_out);
    std::fclose(probe);
  }
  const LoadedModel model = load_model_from_options(o.model, /*require_tokenizer=*/true);
  const Tokenizer& tokenizer = *model.tokenizer;
  if (o.chat) {  // the prompt becomes the user turn of the model's chat template
    PROTOKV_CHECK(o.question.empty(),
                  "--chat takes the whole user turn from -p/-f, not --question");
    std::vector<ChatMessage> messages;
    if (!o.system.empty()) messages.push_back({"system", o.system});
    messages.push_back({"user", context});
    const ChatTemplate family = [&] {
      if (!o.chat_template.empty()) return chat_template_from_name(o.chat_template);
      try {
        return detect_chat_template(tokenizer.chat_template());
      } catch (const Error& e) {  // the library says "force one by name": name the flag
        fail("{} (--chat-template NAME)", e.what());
      }
    }();
    context = render_chat(family, messages, /*add_generation_prompt=*/true);
  }

  const PromptTokens input = build_prompt(tokenizer, context, o.question, setup.query_agnostic);
  // The KV cache grows as tokens arrive: the most it will hold (the whole prompt while it is
  // compressed, then the prompt as the press keeps it, the question and every generated token,
  // never more than the context) is checked now, not met by an OOM kill far into the run.
  const auto prompt_tokens = static_cast<int64_t>(input.prefill.size());
  // The run's session (its budget solved below with --kv-memory-share); the memory-share trials
  // compute as it does.
  SessionOptions session_options = setup.session_options();
  session_options.ubatch = o.ubatch;
  session_options.llama_cpp_arithmetic = o.llama_cpp_arithmetic;
  session_options.llama_cpp_flash_attention = o.llama_cpp_flash_attention;
  session_options.llama_cpp_threads = o.llama_cpp_threads;
  session_options.compress_local_layers = o.compress_local_layers;
  const auto followed = [&](DType type) {
    return type == DType::F32 || (o.llama_cpp_flash_attention && type == DType::F16);
  };
  if (o.llama_cpp_arithmetic &&
      !(followed(setup.cache_type.key) && followed(setup.cache_type.value)))
    std::fprintf(stderr,
                 "warning: llama.cpp's attention order is followed over an f32 cache (f32 or f16 "
                 "with --llama-cpp-flash-attn); with this %s / %s cache attention keeps "
                 "protokv's arithmetic\n",
                 std::string(dtype_name(setup.cache_type.key)).c_str(),
                 std::string(dtype_name(setup.cache_type.value)).c_str());
  if (o.memory_share > 0.0) {
    std::shared_ptr<const PrefilledPrompt> prefilled;  // only for trial compressions
    const eval::MemoryShareBudget solved = eval::solve_memory_share(
        model.weights, setup.press, prompt_tokens,
        [&]() -> const PrefilledPrompt& {
          prefilled = PrefilledPrompt::make(model.weights, input.prefill, session_options);
          return *prefilled;
        },
        o.memory_share, setup.cache_type);
    setup.budget = Budget{};
    setup.budget.entries = solved.entries;
    session_options.budget = setup.budget;
    std::fprintf(stderr, "--kv-memory-share %g: budget %lld entries per KV head (%s)\n",
                 o.memory_share, static_cast<long long>(solved.entries),
                 solved.probed ? "solved from two trial compressions" : "share x prompt tokens");
  }
  const int64_t kept =
      setup.press ? std::min(prompt_tokens, setup.budget.resolve(prompt_tokens)) : prompt_tokens;
  const int64_t held = std::min<int64_t>(
      model.weights.config.context_length,
      std::max(prompt_tokens, kept + static_cast<int64_t>(input.fed_after.size()) + o.n_predict));
  check_memory_fits(fmt::format("generating {} tokens after a {}-token prompt (a KV cache of up to "
                                "{} tokens)",
                                o.n_predict, prompt_tokens, held),
                    kv_cache_bytes(model.weights.config, held, setup.cache_type),
                    available_memory());

  Session session(model.weights, session_options);
  const bool tty = isatty(fileno(stdout)) != 0;
  const bool stream = !o.json;
  GenerateOptions generate_options;
  generate_options.max_new_tokens = o.n_predict;
  generate_options.ignore_eos = o.ignore_eos;
  Utf8StreamBuffer utf8;  // streamed output never splits a UTF-8 character
  std::vector<float> sampled_logits;
  const bool keep_logits = !o.logits_out.empty();
  const GenerateResult result = generate(
      session, tokenizer, input, sampler, generate_options, [&](int32_t, std::string_view piece) {
        // The session's logits are those this token was just sampled from.
        if (keep_logits)
          sampled_logits.insert(sampled_logits.end(), session.logits().begin(),
                                session.logits().end());
        if (stream) write_stdout(utf8.push(piece));
      });
  if (keep_logits)
    io::write_npy_f32(o.logits_out, sampled_logits, static_cast<int64_t>(result.tokens.size()),
                      static_cast<int64_t>(session.logits().size()));
  if (stream) write_stdout(utf8.flush());
  if (stream && tty) write_stdout("\n");

  const std::vector<int32_t>& prompt = input.prefill;
  const std::vector<int32_t>& question = input.fed_after;
  const PrefillStats& prefill = result.prefill;
  const double question_ms = result.question_ms;
  const std::vector<int32_t>& generated = result.tokens;
  const int64_t decode_steps = result.decode_steps;
  const double decode_ms = result.decode_ms;
  const bool context_full = result.stopped == StopReason::kContextFull;

  const double ms_per_token =
      decode_steps > 0 ? decode_ms / static_cast<double>(decode_steps) : 0.0;
  const size_t kv_end = session.cache().kv_bytes();
  if (o.json) {
    nlohmann::json config_json;
    config_json["model"] = model_json(model);
    const nlohmann::json press_json = setup.to_json();
    for (const auto& [key, value] : press_json.items()) config_json[key] = value;
    config_json["sampler"] = sampler_json(o.sampler);
    config_json["threads"] = num_threads();
    config_json["max_new_tokens"] = o.n_predict;
    config_json["stop_at_eos"] = !o.ignore_eos;
    if (o.ubatch > 0) config_json["ubatch"] = o.ubatch;
    if (o.llama_cpp_arithmetic) config_json["llama_cpp_arithmetic"] = true;
    if (o.llama_cpp_flash_attention) {
      config_json["llama_cpp_flash_attention"] = true;
      config_json["llama_cpp_threads"] = o.llama_cpp_threads;
    }
    if (o.memory_share > 0.0) config_json["kv_memory_share"] = o.memory_share;
    if (model.weights.config.has_local_layers())
      config_json["compress_local_layers"] = o.compress_local_layers;
    nlohmann::json out;
    out["config"] = config_json;
    out["prompt_tokens"] = prompt.size();
    out["question_tokens"] =
        setup.query_agnostic ? nlohmann::json(question.size()) : nlohmann::json(nullptr);
    out["question_ms"] =
        setup.query_agnostic ? nlohmann::json(question_ms) : nlohmann::json(nullptr);
    out["generated_tokens"] = generated;
    out["text"] = result.text;
    out["stopped"] = stop_reason_name(result.stopped);
    out["prefill_ms"] = prefill.prefill_ms;
    out["compress_ms"] = prefill.compress_ms;
    out["decode_ms_per_token"] =
        decode_steps > 0 ? nlohmann::json(ms_per_token) : nlohmann::json(nullptr);
    out["decode_steps"] = decode_steps;
    out[json_keys::kKvBytesAfterPrefill] = prefill.kv_bytes;
    out[json_keys::kKvBytesPeakPrefill] = prefill.peak_kv_bytes;
    out[json_keys::kKvBytesEnd] = kv_end;
    // What the full cache would hold after the prompt: kv_bytes_after_prefill over it is the
    // stored share (--kv-memory-share's target).
    out[json_keys::kKvBytesFull] =
        full_kv_bytes(model.weights.config, prompt_tokens, session_options.cache_type);
    // What the last decode step's attention read (less than stored with a recall press).
    out[json_keys::kKvBytesAttendedLastStep] =
        decode_steps > 0 ? nlohmann::json(session.prefill_stats().decode_attended_kv_bytes)
                         : nlohmann::json(nullptr);
    if (o.kv_positions) {
      const KvCache& cache = session.cache();
      nlohmann::json layers = nlohmann::json::array();
      for (int l = 0; l < cache.n_layers(); ++l) {
        nlohmann::json heads = nlohmann::json::array();
        for (const HeadCache& head : cache.layer(l).heads) heads.push_back(head.positions());
        layers.push_back(std::move(heads));
      }
      out["kv_positions"] = std::move(layers);
    }
    // Byte-fallback tokens can split a UTF-8 sequence: replace invalid bytes instead of failing.
    std::string dumped = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    write_stdout(dumped + "\n");
  }

  const double prefill_tok_s =
      prefill.prefill_ms > 0 ? 1000.0 * static_cast<double>(prompt.size()) / prefill.prefill_ms
                             : 0.0;
  std::string summary =
      fmt::format("prompt {} tokens, prefill {:.1f} ms ({:.0f} tok/s, compress {:.1f} ms)",
                  prompt.size(), prefill.prefill_ms, prefill_tok_s, prefill.compress_ms);
  if (!question.empty())
    summary += fmt::format(", question {} tokens {:.1f} ms", question.size(), question_ms);
  summary += fmt::format(" | generated {} tokens", generated.size());
  if (decode_steps > 0)
    summary +=
        fmt::format(", decode {:.3f} ms/token ({:.1f} tok/s)", ms_per_token, 1000.0 / ms_per_token);
  const auto full_bytes = static_cast<double>(
      full_kv_bytes(model.weights.config, prompt_tokens, session_options.cache_type));
  summary +=
      fmt::format(" | KV {} after prefill ({:.1f}% of full, peak {}), {} at end | {} threads",
                  format_bytes(static_cast<double>(prefill.kv_bytes), 2),
                  full_bytes > 0 ? 100.0 * static_cast<double>(prefill.kv_bytes) / full_bytes : 0.0,
                  format_bytes(static_cast<double>(prefill.peak_kv_bytes), 2),
                  format_bytes(static_cast<double>(kv_end), 2), num_threads());
  if (decode_steps > 0 && session.prefill_stats().decode_attended_kv_bytes < kv_end)
    summary += fmt::format(
        " | attended {} per step (recall)",
        format_bytes(static_cast<double>(session.prefill_stats().decode_attended_kv_bytes), 2));
  if (context_full) summary += " | stopped: context full";
  std::fprintf(stderr, "%s\n", summary.c_str());
}

}  // namespace

void register_generate(CLI::App& app) {
  auto options = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand(
      "generate",
      "Generate text from a prompt, with the KV cache compressed by a press. stdout: the "
      "generated text only (streamed); stderr: one summary line.");
  add_model_options(*cmd, options->model);
  auto* prompt = cmd->add_option("-p,--prompt", options->prompt,
                                 "Prompt text (default: none, generation starts after BOS)");
  auto* file =
      cmd->add_option("-f,--file", options->prompt_file, "Read the prompt (context) from a file");
  prompt->excludes(file);
  cmd->add_option("--question", options->question,
                  "Question appended after the context (a newline between); see --mode");
  cmd->add_option("-n,--n-predict", options->n_predict, "Tokens to generate")
      ->capture_default_str();
  add_sampler_options(*cmd, options->sampler);
  add_press_options(*cmd, options->press);
  cmd->add_option("--kv-memory-share", options->memory_share,
                  "instead of --budget/--ratio: the budget at which the press STORES this share "
                  "in (0, 1] of the full cache's KV bytes after the prompt, solved for this "
                  "prompt (equal memory across presses: clusterkv stores everything, pod every "
                  "value, chelsea's outlier heads and Gemma 3's local layers what B does not "
                  "bound)");
  add_ubatch_option(*cmd, options->ubatch);
  cmd->add_flag("--llama-cpp-arithmetic", options->llama_cpp_arithmetic,
                "Compute as llama.cpp's CPU backend does with -fa off (its rounding of "
                "activations, RoPE, SwiGLU and attention orders): logits equal to llama.cpp's "
                "bit for bit on F32, F16 and Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 llama/qwen2/qwen3 files "
                "with an f32 cache and no press; prompts in llama.cpp's ubatch of 512 unless "
                "--ubatch (default: F32 prompt activations, closer to the F32 model; measured "
                "2.5x slower prompts and 1.2x slower decode on SmolLM2 Q4_1)");
  cmd->add_flag("--llama-cpp-flash-attn", options->llama_cpp_flash_attention,
                "With --llama-cpp-arithmetic: attention as llama.cpp's flash attention (-fa on, "
                "its CPU default) over an f32 or f16 cache (llama.cpp's default "
                "--cache-type-k/v f16; it reads either as f16)")
      ->needs("--llama-cpp-arithmetic");
  cmd->add_option("--llama-cpp-threads", options->llama_cpp_threads,
                  "With --llama-cpp-flash-attn: llama.cpp's -t, over which its flash attention "
                  "splits a decode step once the cache reaches 512 cells (padded to 256), which "
                  "changes its rounding")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str()
      ->needs("--llama-cpp-flash-attn");
  cmd->add_flag("--compress-local-layers", options->compress_local_layers,
                "Models with sliding-window layers (Gemma 3): the press also compresses the "
                "local layers (default: only the global ones; a local layer keeps its window "
                "anyway)");
  cmd->add_flag("--ignore-eos", options->ignore_eos,
                "Never stop at an end-of-generation token: as llama.cpp's --ignore-eos, those "
                "tokens are never sampled (logit -inf)");
  cmd->add_flag("--chat", options->chat, "wrap the prompt in the model's chat template");
  cmd->add_option("--system", options->system, "system message for --chat");
  cmd->add_option("--chat-template", options->chat_template,
                  "chat template family for --chat (llama3, chatml, mistral-v7, llama2, phi3, "
                  "gemma, deepseek, ...; default: detected from the model)");
  cmd->add_flag("--json", options->json,
                "Print one JSON object (configuration, tokens, text, timings, KV bytes) instead of "
                "streaming the text");
  cmd->add_flag("--kv-positions", options->kv_positions,
                "with --json: kv_positions[layer][head], the token positions each KV head keeps "
                "at the end (what compression kept, then the generated tokens)");
  cmd->add_option("--logits-out", options->logits_out,
                  "Write the logits each generated token was sampled from to FILE.npy (float32 "
                  "[generated, vocab], numpy.load reads it)");
  cmd->callback([options, cmd] { run_generate(*options, *cmd); });
}

}  // namespace protokv::cli
