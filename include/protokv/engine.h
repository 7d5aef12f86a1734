// SPDX-License-Identifier: Apache-2.0
#pragma once
// Session: one sequence's state (KV cache, scratch) over immutable ModelWeights.
// Prefill runs layer by layer and compresses each layer's KV right after its attention, so peak
// KV memory = one layer's full KV + the compressed cache of the layers before it.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "protokv/kv_cache.h"
#include "protokv/model.h"
#include "protokv/press.h"
#include "protokv/press_spec.h"

namespace protokv {

struct SessionOptions {
  // null: full cache. Each prefill makes this session's own press state from the spec, so one
  // spec may serve many sessions at once.
  std::shared_ptr<const PressSpec> press;
  Budget budget;  // ignored without a press
  // Prompt rows per forward chunk (prefill and append); 0: all at once. Chunking bounds the
  // activation memory; the logits equal those of one chunk to float rounding. With a compressing
  // press and several chunks, the press runs once the final chunk is in (see prefill()).
  int64_t ubatch = 0;
  // Models with sliding-window (local) layers (Gemma 3): their caches keep only the window
  // anyway, so by default the press compresses the global layers only and numbers them as its
  // layers 0..n-1 (PyramidKV's pyramid, PoD's blocks and calibration profiles span the global
  // layers). true: the press compresses the local layers too, and each then also drops what
  // leaves its window. No effect on models without local layers.
  bool compress_local_layers = false;
  // Storage types of the cache's keys and values (llama.cpp's --cache-type-k / --cache-type-v):
  // every attention reads K/V as stored, and every press composes (it stores fewer entries of
  // this size). q8_0 / q4_0 need a head width that is a multiple of 32.
  KvCacheType cache_type;
  // Compute as llama.cpp's CPU backend does without flash attention (llama-completion -fa off),
  // so that the logits equal its own to the bit where protokv knows its order (docs/DESIGN.md
  // §llama.cpp's arithmetic): prompt rows of the legacy quants (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) as
  // decode rows (int8 activations in ggml's blocks), F32 / F16 rows in tinyBLAS's order (F16
  // activations for F16), RoPE angles in float as ggml's, SwiGLU with ggml's vector exp,
  // attention over an F32 cache in ggml's order (scores, softmax, value sums; kernels/
  // llama_cpp_order.h) and the last layer's FFN on the returned row only. Measured bit-identical
  // logits on F32/F16/legacy-quant llama, qwen2 and qwen3 files and SmolLM2-135M Q4_1 against a
  // llama.cpp built for AVX-512 by GCC 12. Prompts are run in chunks of llama.cpp's default
  // ubatch (512) unless `ubatch` is set (it should then be llama.cpp's -ub). Attention keeps
  // protokv's own arithmetic with a bf16/quantised cache (and an f16 one without
  // llama_cpp_flash_attention), Gemma 3 (its own graph), a
  // non-default attention scale, log-weights, shared keys or selected entries (presses), or a
  // press or observer that reads the attention probabilities; a press that only evicts attends
  // in llama.cpp's order over what it keeps. The K-quants' and BF16 prompts keep F32
  // activations. Random 1024-wide files, 2 threads, 512-token prompts: Q4_0
  // 1.26x as fast as with F32 activations, Q8_0 0.76x, Q4_1 0.57x. false (the default) computes
  // in F32 where it can (sgemm on dequantised panels for prompts, double-precision RoPE angles),
  // closer to the F32 model (transformers, kvpress).
  bool llama_cpp_arithmetic = false;
  // With llama_cpp_arithmetic: attention as llama.cpp's flash attention computes it
  // (ggml_flash_attn_ext, llama-completion -fa on, the default -fa auto on a CPU; kernels/
  // llama_cpp_order.h ggml_order::flash_attention) over an F32 or F16 cache (f16 is llama.cpp's
  // default -ctk / -ctv; it reads an F32 cache's K/V as F16 for flash attention too), instead of
  // its QK^T / softmax / V products. Its result depends on its thread count once a decode step
  // reaches 512 cells (llama_cpp_threads). Requires llama_cpp_arithmetic.
  bool llama_cpp_flash_attention = false;
  // With llama_cpp_flash_attention: llama.cpp's thread count (-t; 1 to 1024), over which its
  // flash attention splits a decode step's cells once they reach 512 (padded to 256), merging
  // the parts in another rounding. Its default is the machine's physical cores.
  int llama_cpp_threads = 1;
};

struct PrefillStats {
  int64_t n_tokens = 0;
  double prefill_ms = 0.0;   // whole prefill, compression included
  double compress_ms = 0.0;  // time inside the press
  size_t peak_kv_bytes = 0;  // max over layers of (compressed layers so far + one full layer)
  size_t kv_bytes = 0;       // stored after prefill
  // Keys and values the last decode step's attention read, summed over query heads and divided by
  // the group size: kv_bytes of the cache for dense attention, less with a recall press
  // (clusterkv stores everything but attends to B entries). 0 before the first decode step.
  size_t decode_attended_kv_bytes = 0;
};

// Observes decode attention (fidelity metrics): the same per-layer step a press's on_decode gets,
// after the press's selection and before its on_decode. Called from the engine's decode step.
class DecodeObserver {
 public:
  virtual ~DecodeObserver() = default;
  // Whether step.probs must be filled.
  virtual bool wants_probabilities() const { return false; }
  virtual void on_decode(const DecodeStep& step) = 0;
};

class Session;

// A prompt run once through the model without compression — every layer's post-RoPE K/V and
// queries, and the last logits — from which any number of sessions start, each compressing it
// with its own press (Session::prefill(const PrefilledPrompt&)). Compression never changes the
// prompt's own forward pass (a layer's compression happens after its attention, and later layers
// read activations, not the cache), so a session started from it equals one that prefilled the
// tokens itself, bit for bit, given the same ubatch. Evaluations that compare many presses on
// one prompt run the model over it once instead of once per press. Memory: the full K/V of every
// layer plus every layer's queries.
class PrefilledPrompt {
 public:
  // Runs `tokens` (positions 0..n-1) through `weights` in chunks of `ubatch` rows (0: at once),
  // into a cache of `cache_type`, in protokv's arithmetic; it serves sessions of that cache type
  // and arithmetic only. Throws Error as Session::prefill does.
  static std::shared_ptr<const PrefilledPrompt> make(const ModelWeights& weights,
                                                     std::span<const int32_t> tokens,
                                                     int64_t ubatch = 0,
                                                     KvCacheType cache_type = {});
  // The same with the ubatch, cache type and arithmetic (llama_cpp_arithmetic,
  // llama_cpp_flash_attention, llama_cpp_threads) of `options`; its press and budget play no
  // part.
  static std::shared_ptr<const PrefilledPrompt> make(const ModelWeights& weights,
                                                     std::span<const int32_t> tokens,
                                                     const SessionOptions& options);
  ~PrefilledPrompt();
  int64_t n_tokens() const;
  double prefill_ms() const;  // the forward pass, once
  KvCacheType cache_type() const;
  // The options a session needs to start from this prompt: its ubatch, cache type and
  // arithmetic (no press).
  SessionOptions options() const;

  struct Data;
  explicit PrefilledPrompt(std::unique_ptr<Data> data);
  const Data& data() const { return *data_; }

 private:
  std::unique_ptr<Data> data_;
};

// One decode step of several sessions over the same weights at once (a server's decode round):
// session i takes tokens[i] at its own position n_past(). The transformer block runs once over
// all their rows, so each weight matrix is read once per step instead of once per session, while
// each session attends to its own cache with its own press. Returns each session's logits, in
// order, equal bit for bit to what sessions[i]->decode(tokens[i]) would return. Throws Error,
// before any session changes, for mismatched sizes, sessions of different weights, a session
// given twice, a token out of range or a full context.
std::vector<std::span<const float>> decode_batch(std::span<Session* const> sessions,
                                                 std::span<const int32_t> tokens);

class Session {
 public:
  explicit Session(const ModelWeights& weights, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Prefills `tokens` into an empty cache at positions 0..n-1 (resetting the session) and
  // compresses with the press. Returns the logits of the last token [vocab]. Throws Error on an
  // empty prompt, a prompt longer than the context, or token ids out of range.
  // In chunks (options.ubatch < n), each chunk is appended to the cache in full and the press
  // compresses every layer once the final chunk is in, from the same post-RoPE Q/K/V a single
  // chunk gives (to float rounding); peak KV memory is then the whole uncompressed cache.
  std::span<const float> prefill(std::span<const int32_t> tokens);
  // prefill(tokens) one chunk at a time, so that a caller (the server) can run other sessions'
  // decode steps between the chunks of a long prompt: begin_prefill resets the session, checks
  // the prompt (throwing as prefill does) and begins the press; each prefill_chunk() runs the
  // next options.ubatch rows (the whole prompt when ubatch is 0) and returns true once the
  // prompt is in and compressed, when logits() holds its last token's logits. prefill(tokens) is
  // exactly begin_prefill and prefill_chunk until true. A failure resets the session.
  void begin_prefill(std::span<const int32_t> tokens);
  bool prefill_chunk();
  // The logits of the last token run (prefill, append or decode).
  std::span<const float> logits() const;
  // The same from a prompt run once already (PrefilledPrompt): copies its uncompressed cache and
  // compresses it with this session's press, as prefill(tokens) would. prefill_stats() times the
  // copy and the compression only (prefill_ms excludes the forward pass, counted once in
  // prompt.prefill_ms()). Throws Error for a prompt made from other weights.
  std::span<const float> prefill(const PrefilledPrompt& prompt);
  // Feeds `tokens` at positions n_past().. without resetting (a follow-up turn, or a question
  // after a compressed context): their K/V are appended in full to whatever the cache holds and
  // they attend to it like decoded tokens do. Never compresses; the press's decode hook sees each
  // row after its chunk's attention. Returns the logits of the last token. Throws Error, leaving
  // the session unchanged, when the tokens are empty, out of range or do not fit the context.
  std::span<const float> append(std::span<const int32_t> tokens);
  // append(tokens), handing `on_logits` the logits of every appended token in order: (i, the
  // logits after tokens[i]), those of decode(tokens[i]) to float rounding: each row is
  // multiplied as a decode step multiplies it, but every weight matrix is read once per chunk
  // (options.ubatch rows) for all of its rows; with llama_cpp_arithmetic, as llama.cpp's batch
  // multiplies them (its logits for every row of the batch, to the bit). For scoring a text in
  // one pass (perplexity). The span is valid during the call only.
  using RowLogits = std::function<void(int64_t, std::span<const float>)>;
  std::span<const float> append(std::span<const int32_t> tokens, const RowLogits& on_logits);
  // Appends one token at position n_past() and returns its logits.
  std::span<const float> decode(int32_t token);

  int64_t n_past() const;
  const KvCache& cache() const;
  const PrefillStats& prefill_stats() const;
  const ModelConfig& config() const;
  // The current sequence's press state, made from options.press at prefill (its scores,
  // diagnostics, decode-time statistics); null without a press, before prefill and after reset().
  const Press* press() const;
  void set_observer(DecodeObserver* observer);
  // The budget of the next prefill (SessionOptions::budget): an equal-memory evaluation solves
  // one per prompt (eval/memory_share.h). Throws Error for an invalid budget.
  void set_budget(const Budget& budget);
  void reset();

 private:
  friend class PrefilledPrompt;
  friend std::vector<std::span<const float>> decode_batch(std::span<Session* const> sessions,
                                                          std::span<const int32_t> tokens);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace protokv
