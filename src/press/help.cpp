// press_help(): the methods, what they keep, their options with defaults, and where they are
// approximate or differ from the reference code. docs/methods.md says the same at length.
#include <fmt/format.h>

#include "press/allocator.h"
#include "press/h2o.h"
#include "press/protokv.h"
#include "press/streaming_llm.h"
#include "press/window_scores.h"
#include "protokv/press_registry.h"

namespace protokv {

std::string press_help() {
  using press::AllocatorConfig;
  using press::ProtoKvConfig;
  using press::WindowScoreConfig;
  const auto w = WindowScoreConfig::kDefaultWindow;
  const auto pool = WindowScoreConfig::kDefaultPool;
  std::string text;
  auto add = [&text](const std::string& s) { text += s; };

  add("Presses (--press NAME[:key=value,...]; --budget B = entries kept per KV head per layer,\n"
      "window and sinks included; --ratio r = floor(n*r)). A budget >= the prompt length\n"
      "compresses nothing. Selection is per KV head (GQA: the group's query-head scores are\n"
      "reduced, gqa=mean|max|sum), so memory really shrinks; the reference code (KVCache-Factory)\n"
      "repeats K/V per query head instead and stores group-times more.\n\n");
  add("full           no compression (the reference for every fidelity metric). No options.\n\n");
  add(
      fmt::format("streaming_llm  keep the first `sinks` tokens and the last B - sinks.\n"
                  "               sinks={}. Needs B >= sinks + 1. No allocator.\n\n",
                  press::StreamingLlmPress::kDefaultSinks));
  add(fmt::format(
      "h2o            score = column sums of the full causal attention of ALL prompt queries over\n"
      "               keys [0, n-w) (tiled, never n x n), reduced over the GQA group; keep the "
      "top\n"
      "               B-w plus the last w.  window={} gqa=mean decode=0.\n"
      "               decode=1: each decode step adds the new query's attention to the kept\n"
      "               entries' scores and evicts the lowest-scored entry outside the last\n"
      "               `recent` when a head exceeds its prefill budget (only for sequences whose\n"
      "               prefill was compressed). As in H2O's code the budget is split into heavy\n"
      "               hitters and recent tokens: recent=B/2 by default (it replaces window=),\n"
      "               the top B-recent by score are the heavy hitters.\n"
      "               Cost O(n^2 d) per head: slow on long prompts by nature.\n\n",
      w));
  add(fmt::format(
      "snapkv         score = observation-window attention (last w queries, fp32 softmax over\n"
      "               the whole causal row, summed over the window rows; SnapKV Eq. 4), pooled\n"
      "               per query head (stride 1, padding pool/2; max pads -inf, avg zero-pads and\n"
      "               divides by pool), then reduced over the GQA group; keep the top B-w prefix\n"
      "               entries (ties: lower position) plus the window.\n"
      "               window={} pool={} pool_type=max|avg (max) gqa=mean|max|sum (mean).\n"
      "               gqa_order=pool_first|reduce_first (pool_first): pool each query head, then\n"
      "               reduce (as kvpress does), or reduce the group, then pool (FFY0/\n"
      "               AdaKV, KVCache-Factory's kv_head mode). Also for pyramidkv and adakv.\n\n",
      w, pool));
  add(fmt::format(
      "pyramidkv      snapkv scores + the pyramid allocator: b = B-w, min = b//beta,\n"
      "               max = 2b-min; if max >= n-w: max = n-w, min = 2b-max;\n"
      "               step = (max-min)//(L-1); layer l keeps max - l*step + w. Uniform B when\n"
      "               n < 2b or L = 1. beta={} plus the snapkv options. Like the reference, the\n"
      "               layers' total can exceed L*B slightly (integer steps).\n\n",
      AllocatorConfig::kDefaultBeta));
  add(fmt::format(
      "adakv          snapkv scores + the adakv allocator, per layer: global top H*b over all KV\n"
      "               heads' scores (b = B-w); cnt_h = head h's share; head h keeps\n"
      "               cnt_h*(1-f) + floor(f*b) + w, apportioned by largest remainder so the heads\n"
      "               sum exactly to H*B (plain rounding can miss by up to H entries).\n"
      "               floor={} normalise=0 (1: multiply each head's scores by its top-b mass over\n"
      "               its total mass before the global ranking, as the reference code does) plus\n"
      "               the snapkv options. Heads get different lengths.\n\n",
      AllocatorConfig::kDefaultFloor));
  add(fmt::format(
      "protokv        ProtoKV Algorithm 1 per KV head over the prefix keys (positions < n-w,\n"
      "               post-RoPE): k consecutive chunks (sizes floor/ceil of n_prefix/k, covering\n"
      "               every token); deviation delta = (1-cos(k_t, mu_m))/||sigma_m|| (Eq. 10); "
      "the\n"
      "               top-p form the irregular set O; regular prototypes = normalised chunk sums\n"
      "               without O (Eq. 11); O's keys, L2-normalised, are hashed with random Fourier\n"
      "               features (Eqs. 12-14, r bits, u = 2^r buckets, W ~ N(0, gamma^2), b ~\n"
      "               U(0, 2pi), drawn per (layer, KV head) from seed); irregular prototypes =\n"
      "               normalised bucket sums, empty buckets dropped (Eq. 15); every prefix token\n"
      "               goes to the prototype of highest cosine (Eq. 17, one blocked GEMM); token\n"
      "               score = mean of the UNPOOLED window scores over its cluster (Eq. 18;\n"
      "               pool=1 by default, pool=7 pools as snapkv); keep the top B-w (ties: the\n"
      "               token's own window score, then lower position) plus the window.\n"
      "               chunks=auto: k = clamp(round(n_prefix/chunk_len), 1, max_chunks) with\n"
      "               chunk_len={} max_chunks={}; chunks=K fixes k (at most n_prefix).\n"
      "               lsh_bits={} (u = 2^r) irregular=3u ({}) gamma={} (the paper gives none)\n"
      "               seed={} plus window/pool/pool_type/gqa as snapkv except pool=1 (GQA: the "
      "scores "
      "are\n"
      "               reduced over the group before the cluster mean).\n"
      "               Variants: deviation=chunk|neighbourhood (paper 002: S(i) = mean cosine to\n"
      "               the keys within kappa positions, kappa={}; O = top-p of -zscore(S));\n"
      "               score=mean|sum_logits (psi(C) = (sum of the group's window queries) .\n"
      "               (sum of C's keys), no softmax, no pooling); select=tokens|clusters (whole\n"
      "               clusters in score order, the last one truncated by the tokens' own scores;\n"
      "               with score=mean it differs from tokens only when two clusters tie).\n"
      "               Ablations, same prototype count: prototypes=chunk (k+u chunks, no O),\n"
      "               prototypes=lsh (every prefix key hashed with r' = round(log2(k+u)) bits,\n"
      "               at most 12), prototypes=hybrid (default).\n"
      "               assign=exact (default: Eq. 17 over every prototype) | assign=local: an\n"
      "               opt-in APPROXIMATION of Eq. 17, not the paper's: each token is compared\n"
      "               only with the prototypes of its own chunk, assign_neighbours=1 chunks on\n"
      "               each side and the LSH buckets (docs/methods.md gives how often it differs\n"
      "               from exact); needs prototypes=hybrid or chunk.\n\n",
      ProtoKvConfig::kDefaultChunkLen, ProtoKvConfig::kDefaultMaxChunks,
      ProtoKvConfig::kDefaultLshBits, 3 * (1 << ProtoKvConfig::kDefaultLshBits),
      ProtoKvConfig::kDefaultGamma, ProtoKvConfig::kDefaultSeed, ProtoKvConfig::kDefaultKappa));
  add("Allocators (--alloc): uniform (every head keeps B), pyramid (the pyramidkv rule, option\n"
      "beta=), adakv (options floor=, normalise=). Any of h2o, snapkv, protokv composes with any\n"
      "allocator; pyramidkv and adakv are snapkv with their allocator, so another --alloc is an\n"
      "error. full and streaming_llm take none.\n");
  return text;
}

}  // namespace protokv
