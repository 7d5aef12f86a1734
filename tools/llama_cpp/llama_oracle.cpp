// SPDX-License-Identifier: Apache-2.0
// protokv-llama-oracle: llama.cpp's greedy continuations and chat-template renderings for the
// real-model fixtures of tests/test_real_models.cpp (tools/llama_cpp/make_real_model_fixtures.sh).
// Built by tools/llama_cpp/build.sh against the llama.cpp it builds (not part of protokv's build).
//
//   protokv-llama-oracle MODEL.gguf JOB.json    # prints one JSON object on stdout
//
// JOB.json: {"n_predict": 64, "threads": 2, "llama_simple_context": false, "reference_model": "",
//            "greedy": [{"name": ..., "text": ...}, ...],
//            "chat_template": "" (the model's own tokenizer.chat_template) or a built-in name,
//            "chats": [{"name": ..., "messages": [{"role", "content"}], "add_generation_prompt"}]}
// Output:   {"greedy": [{"name", "prompt_ids", "ids", "runner_up", "margins", "simple_text",
//                        "act_rounding", "margin_rounding" (with a reference model)}],
//            "chats": [{"name", "text"}]}
//
// Greedy runs as llama-simple does (examples/simple/simple.cpp: the prompt tokenised with
// add_special and parse_special, prefilled in one batch, then one token per llama_decode, argmax,
// stop after an end-of-generation token) but keeps K/V in F32 without flash attention, like
// protokv-dump-logits, so the reference carries only the rounding of the weights and llama.cpp's
// kernels, not of an F16 cache. With "llama_simple_context" it uses llama-simple's own context
// instead (F16 K/V, flash attention auto, default threads), to measure where that departs from
// the F32 run. "ids" are the generated tokens (an end-of-generation token, when reached, is the
// last one), "runner_up" the second-best token at each step, "margins" llama.cpp's top-1 minus
// top-2 logit (how near a tie each choice was), "simple_text" what llama-simple would print for
// them (pieces of the prompt and of the generated tokens with special tokens rendered, the end
// token left out): the fixture script compares it with the real llama-simple's output. With
// "reference_model" (the same model dequantised to F32 by llama-quantize), "act_rounding" is the
// max |logit difference| between the two over the vocabulary and the steps, teacher-forced on the
// generated tokens, and "margin_rounding" the max difference of the top-1 minus runner-up margin:
// the part of llama.cpp's result due to its rounding of activations (Q8 activations in quantised
// mat-muls), which an engine computing in F32 on the same weights should differ by (as
// act_rounding in tools/llama_cpp/make_fixtures.sh).
//
// Chats are rendered with llama_chat_apply_template, llama.cpp's built-in formatter (no Jinja): the
// model's template text is matched to a family by llm_chat_detect_template.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "llama.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;

void quiet_log(enum ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "protokv-llama-oracle: error: %s\n", message.c_str());
  std::exit(1);
}

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text) {
  // add_special and parse_special, as llama-simple tokenises its prompt.
  const int32_t n = -llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), nullptr,
                                    0, true, true);
  std::vector<llama_token> out(static_cast<size_t>(n));
  if (llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(), n, true,
                     true) != n) {
    die("tokenisation failed");
  }
  return out;
}

std::string piece(const llama_vocab* vocab, llama_token token) {
  char buf[256];
  const int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, true);
  if (n < 0) die("token_to_piece failed for " + std::to_string(token));
  return std::string(buf, static_cast<size_t>(n));
}

llama_context* make_context(llama_model* model, size_t n_prompt, int n_predict, int threads,
                            bool llama_simple_context) {
  llama_context_params params = llama_context_default_params();
  params.n_ctx = static_cast<uint32_t>(n_prompt + static_cast<size_t>(n_predict));
  params.n_batch = static_cast<uint32_t>(n_prompt);
  if (llama_simple_context) {
    // llama-simple's own context: default threads, F16 K/V, flash attention "auto".
    params.n_ctx = static_cast<uint32_t>(n_prompt + static_cast<size_t>(n_predict) - 1);
  } else {
    params.n_ubatch = static_cast<uint32_t>(n_prompt);
    params.n_seq_max = 1;
    params.n_threads = threads;
    params.n_threads_batch = threads;
    params.type_k = GGML_TYPE_F32;
    params.type_v = GGML_TYPE_F32;
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  }
  llama_context* ctx = llama_init_from_model(model, params);
  if (ctx == nullptr) die("cannot create a context");
  return ctx;
}

struct Rounding {
  double logits = 0.0;   // max |logit difference| over the vocabulary and the steps
  double margins = 0.0;  // max |difference| of the top-1 minus runner-up margin over the steps
};

// How far `reference` is from the run that produced `rows` (one per step): teacher-forced on the
// same tokens and decoded the same way (the prompt in one batch, then one token per llama_decode).
Rounding rounding_against(llama_model* reference, const std::vector<llama_token>& prompt,
                          std::vector<llama_token> generated, const std::vector<int32_t>& runner_up,
                          const std::vector<std::vector<float>>& rows, int n_predict, int threads) {
  llama_context* ctx = make_context(reference, prompt.size(), n_predict, threads, false);
  std::vector<llama_token> tokens = prompt;
  llama_batch batch = llama_batch_get_one(tokens.data(), static_cast<int32_t>(tokens.size()));
  Rounding out;
  for (size_t step = 0; step < rows.size(); ++step) {
    if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
    const float* row = llama_get_logits_ith(ctx, -1);
    const std::vector<float>& mine = rows[step];
    for (size_t v = 0; v < mine.size(); ++v)
      out.logits = std::max(out.logits, std::fabs(static_cast<double>(row[v]) - mine[v]));
    const auto best = static_cast<size_t>(generated[step]);
    const auto second = static_cast<size_t>(runner_up[step]);
    const double margin = static_cast<double>(mine[best]) - mine[second];
    const double ref_margin = static_cast<double>(row[best]) - row[second];
    out.margins = std::max(out.margins, std::fabs(margin - ref_margin));
    batch = llama_batch_get_one(&generated[step], 1);
  }
  llama_free(ctx);
  return out;
}

json greedy(llama_model* model, llama_model* reference, const std::string& text, int n_predict,
            int threads, bool llama_simple_context) {
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  const std::vector<llama_token> prompt = tokenize(vocab, text);
  if (prompt.empty()) die("empty prompt");
  llama_context* ctx = make_context(model, prompt.size(), n_predict, threads, llama_simple_context);

  std::string simple_text;
  for (const llama_token t : prompt) simple_text += piece(vocab, t);
  std::vector<llama_token> tokens = prompt;
  std::vector<llama_token> generated;
  std::vector<std::vector<float>> rows;  // kept for the comparison with `reference`
  std::vector<int32_t> runner_up;
  json margins = json::array();
  llama_batch batch = llama_batch_get_one(tokens.data(), static_cast<int32_t>(tokens.size()));
  for (int step = 0; step < n_predict; ++step) {
    if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
    const float* logits = llama_get_logits_ith(ctx, -1);
    if (reference != nullptr) rows.emplace_back(logits, logits + n_vocab);
    // Argmax with the first index winning ties, as llama_sampler_init_greedy.
    int32_t best = 0;
    for (int32_t v = 1; v < n_vocab; ++v)
      if (logits[v] > logits[best]) best = v;
    int32_t second = best == 0 ? 1 : 0;
    for (int32_t v = 0; v < n_vocab; ++v)
      if (v != best && logits[v] > logits[second]) second = v;
    generated.push_back(best);
    runner_up.push_back(second);
    margins.push_back(std::round((static_cast<double>(logits[best]) - logits[second]) * 1e4) / 1e4);
    if (llama_vocab_is_eog(vocab, best)) break;
    simple_text += piece(vocab, best);
    tokens.push_back(best);
    batch = llama_batch_get_one(&tokens.back(), 1);
  }
  llama_free(ctx);
  json out = {{"prompt_ids", prompt},
              {"ids", generated},
              {"runner_up", runner_up},
              {"margins", margins},
              {"simple_text", simple_text}};
  if (reference != nullptr) {
    const Rounding r =
        rounding_against(reference, prompt, generated, runner_up, rows, n_predict, threads);
    out["act_rounding"] = std::ceil(r.logits * 1e4) / 1e4;
    out["margin_rounding"] = std::ceil(r.margins * 1e4) / 1e4;
  }
  return out;
}

std::string render_chat(const std::string& tmpl, const json& chat) {
  std::vector<std::string> roles, contents;
  for (const json& m : chat.at("messages")) {
    roles.push_back(m.at("role").get<std::string>());
    contents.push_back(m.at("content").get<std::string>());
  }
  std::vector<llama_chat_message> messages;
  size_t total = 0;
  for (size_t i = 0; i < roles.size(); ++i) {
    messages.push_back({roles[i].c_str(), contents[i].c_str()});
    total += roles[i].size() + contents[i].size();
  }
  const bool add_ass = chat.value("add_generation_prompt", true);
  std::vector<char> buf(2 * total + 256);
  int32_t n = llama_chat_apply_template(tmpl.c_str(), messages.data(), messages.size(), add_ass,
                                        buf.data(), static_cast<int32_t>(buf.size()));
  if (n < 0) die("llama_chat_apply_template refused the template");
  if (static_cast<size_t>(n) > buf.size()) {
    buf.resize(static_cast<size_t>(n));
    n = llama_chat_apply_template(tmpl.c_str(), messages.data(), messages.size(), add_ass,
                                  buf.data(), n);
  }
  return std::string(buf.data(), static_cast<size_t>(n));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf JOB.json\n", argv[0]);
    return 1;
  }
  std::ifstream in(argv[2]);
  if (!in) die(std::string("cannot read ") + argv[2]);
  const json job = json::parse(in);

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params model_params = llama_model_default_params();
  model_params.n_gpu_layers = 0;
  model_params.progress_callback = [](float, void*) { return true; };  // no progress dots
  llama_model* model = llama_model_load_from_file(argv[1], model_params);
  if (model == nullptr) die(std::string("cannot load ") + argv[1]);

  llama_model* reference = nullptr;
  if (const std::string path = job.value("reference_model", std::string()); !path.empty()) {
    reference = llama_model_load_from_file(path.c_str(), model_params);
    if (reference == nullptr) die("cannot load " + path);
  }

  json out = {{"greedy", json::array()}, {"chats", json::array()}};
  const int n_predict = job.value("n_predict", 64);
  const int threads = job.value("threads", 2);
  for (const json& p : job.value("greedy", json::array())) {
    json r = greedy(model, reference, p.at("text").get<std::string>(), n_predict, threads,
                    job.value("llama_simple_context", false));
    r["name"] = p.at("name");
    out["greedy"].push_back(r);
  }
  std::string tmpl = job.value("chat_template", std::string());
  if (tmpl.empty() && job.contains("chats")) {
    const char* own = llama_model_chat_template(model, nullptr);
    if (own == nullptr) die("the model has no chat template; name a built-in one");
    tmpl = own;
  }
  for (const json& c : job.value("chats", json::array())) {
    out["chats"].push_back({{"name", c.at("name")}, {"text", render_chat(tmpl, c)}});
  }
  // Invalid UTF-8 (a continuation cut inside a character) becomes U+FFFD rather than failing.
  std::printf("%s\n", out.dump(1, ' ', false, json::error_handler_t::replace).c_str());

  if (reference != nullptr) llama_model_free(reference);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
