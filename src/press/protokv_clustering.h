// SPDX-License-Identifier: Apache-2.0
#pragma once
// ProtoKV's prototype construction and token clustering (ProtoKV §4.1-4.3, Algorithm 1
// lines 1-17; variants from its ICLR version), for the prefix keys of one KV head.
// Kept apart from the press so that every step can be tested on hand-made keys.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/clustering.h"

namespace protokv::press {

enum class Deviation { Chunk, Neighbourhood };
enum class PrototypeSet { Hybrid, Chunk, Lsh };
// Eq. 17 over every prototype (Exact), or an opt-in approximation (Local) that compares each
// token only with the prototypes of its own chunk, the `local_neighbours` chunks on each side and
// every LSH bucket prototype.
enum class Assignment { Exact, Local };

struct ClusteringConfig {
  int64_t chunks = 1;      // k regular chunks (already resolved for this prefix length)
  int lsh_bits = 2;        // r; u = 2^r buckets
  int64_t irregular = 12;  // p, size of the irregular set O
  double gamma = 1.0;      // std of the RFF projection W ~ N(0, gamma^2 I)
  uint64_t lsh_seed = 0;   // seed of W and b for this (layer, head)
  // What Eq. 12's phi is applied to: the L2-normalised key (true, lsh_input=unit, our default:
  // the buckets group directions, as every other ProtoKV step compares by cosine) or the raw key
  // (false, lsh_input=raw, Eq. 12 as written: with gamma = 1 and |k| >> 1 the phases wrap many
  // times and nearby keys scatter).
  bool lsh_unit_keys = true;
  Deviation deviation = Deviation::Chunk;
  int kappa = 5;  // neighbourhood half-width for Deviation::Neighbourhood
  PrototypeSet prototypes = PrototypeSet::Hybrid;
  Assignment assignment = Assignment::Exact;
  int local_neighbours = 1;  // chunks on each side of the token's own (Assignment::Local)

  int buckets() const { return 1 << lsh_bits; }
  // assign=local's reach over `n_chunks` chunks (-1: exact assignment, no local dots wanted).
  int local_reach(int64_t n_chunks) const {
    return assignment == Assignment::Local
               ? static_cast<int>(std::min<int64_t>(local_neighbours, n_chunks - 1))
               : -1;
  }
};

struct Clustering {
  int head_dim = 0;
  std::vector<int32_t> irregular;   // O: token indices, ascending (empty unless hybrid)
  std::vector<float> prototypes;    // [n_prototypes, head_dim], unit rows; regular ones first
  std::vector<int32_t> origin;      // [n_prototypes] chunk index (regular) or bucket (irregular)
  int n_regular = 0;                // prototypes [0, n_regular) come from chunks
  int64_t n_chunks = 0;             // chunks the regular prototypes were cut from (0: none)
  std::vector<int32_t> assignment;  // [n_prefix] index of each token's prototype
  int64_t local_bucket_dots = -1;   // assign=local: bucket dots computed (-1: exact assignment)

  int n_prototypes() const { return static_cast<int>(origin.size()); }
};

// chunk_begin(m, n, k): the first token of chunk m of k over n (kernels/clustering.h).
using kernels::chunk_begin;
// Chunk of token t (inverse of chunk_begin).
int64_t chunk_of(int64_t t, int64_t n, int64_t k);

// Rows of `in` [n, d] scaled to unit L2 norm (zero rows stay zero).
void normalise_rows(const float* in, int64_t n, int d, float* out);

// ||k_t|| for every row of keys [n, d]: out [n].
void key_norms(const float* keys, int64_t n, int d, float* norms);

// assign=local's chunk candidates, computed by the chunk pass (kernels/clustering.h).
using kernels::LocalDots;

// One pass over the keys, chunk by chunk (each chunk's rows stay in cache): key norms [n], raw key
// sums per chunk chunk_sums [k, d], if delta is not null the Eq. 10 deviations [n], and if
// local.dots is not null assign=local's candidate dots.
void chunk_pass(const float* keys, int64_t n, int d, int64_t k, float* norms, float* chunk_sums,
                float* delta, const LocalDots& local = {});
// The same with plain loops for any head_dim: the scalar kernel variant's (chunk_pass uses the
// AVX-512 kernels for head_dim 64, 128 and 256 where the CPU has them); exposed so that tests can
// check the two agree.
void chunk_pass_generic(const float* keys, int64_t n, int d, int64_t k, float* norms,
                        float* chunk_sums, float* delta, const LocalDots& local = {});

// chunk_pass over the chunks [m_begin, m_end) of k only: each chunk's results depend on its own
// rows alone (the local dots also on the sums of the `reach` chunks before it, so ranges must run
// in order), so running the chunks in several ranges gives exactly chunk_pass's results.
void chunk_pass_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                      int64_t m_end, float* norms, float* chunk_sums, float* delta,
                      const LocalDots& local = {});

// The results of chunk_pass with deviations (norms [n], chunk_sums [chunks, d], delta [n], and
// assign=local's dots where asked for). cluster_keys may subtract from chunk_sums (Eq. 11 without
// the irregular keys) and overwrite the local dots of chunks that lost irregular tokens.
struct ChunkPassResult {
  const float* norms = nullptr;
  float* chunk_sums = nullptr;
  const float* delta = nullptr;
  int64_t chunks = 0;
  LocalDots local;  // local.dots null: not computed
};

// chunk_pass run piecewise while another pass streams the keys (ProtoKV's window GEMM, block by
// block): advance(e) runs every chunk that ends at or before key e and has not run yet, so each
// chunk's rows are read while the window GEMM has just brought them into cache. Buffers are reused
// across start() calls.
class ChunkPassStream {
 public:
  // local_reach >= 0: also assign=local's dots for that reach (at most k - 1).
  void start(const float* keys, int64_t n, int d, int64_t k, int local_reach = -1);
  void advance(int64_t keys_ready);
  // Runs the chunks not run yet, then the whole pass's results (valid until the next start()).
  ChunkPassResult result();

 private:
  const float* keys_ = nullptr;
  int64_t n_ = 0, k_ = 0, done_ = 0;
  int d_ = 0;
  std::vector<float> norms_, sums_, delta_, local_dots_;
  LocalDots local_;
};

// ProtoKV Eq. 10: delta_t = (1 - cos(k_t, mu_m)) / ||sigma_m||_2 over k chunks; out [n].
// A chunk whose keys are all equal (sigma = 0) gives delta = 0.
void chunk_deviation(const float* keys, int64_t n, int d, int64_t k, float* delta);

// Paper 002: S(i) = mean cos(k_i, k_j) over the neighbours j in [i - kappa, i + kappa], j != i,
// inside the prefix; out [n] = Theta(i) = -(S(i) - mean S) / std S, so that high = irregular.
// keys [n, d], norms [n] their L2 norms.
void neighbourhood_outlier_degree(const float* keys, const float* norms, int64_t n, int d,
                                  int kappa, float* theta);

// Indices of the p largest values (ties: lower index), ascending.
std::vector<int32_t> top_indices(const float* values, int64_t n, int64_t p);

// Random Fourier feature LSH (ProtoKV Eqs. 12-14): phi(k) = sqrt(2/r) cos(W k + b),
// W [r, d] ~ N(0, gamma^2), b ~ U(0, 2 pi), bits h = [phi > 0], bucket = sum_i 2^(r-i) h_i mod 2^r.
struct LshProjection {
  int bits = 0;
  int head_dim = 0;
  std::vector<float> w;      // [bits, head_dim]
  std::vector<float> phase;  // [bits]
};
LshProjection make_lsh_projection(int bits, int head_dim, double gamma, uint64_t seed);
// `unit_key` is the L2-normalised key.
int32_t lsh_bucket(const LshProjection& lsh, const float* unit_key);

// Seed of the LSH projection of (layer, kv head): independent per head, reproducible.
uint64_t lsh_seed_for(uint64_t seed, int layer, int kv_head);

// ProtoKV Eq. 17: index of the prototype of highest cosine for every key, computed as a blocked
// GEMM keys [n, d] x prototypes^T [d, count]. The prototypes are unit vectors, so k . c is the
// cosine times ||k||: the same argmax, and the keys need no normalisation. Ties go to the lower
// index.
void assign_to_prototypes(const float* keys, int64_t n, int d, const float* prototypes, int count,
                          int32_t* out);

// Approximate Eq. 17 (not the paper's): for every token of chunk m (of `clusters.n_chunks` over n),
// the first maximum of k . c over the regular prototypes of chunks [m - reach, m + reach] and
// every irregular (bucket) prototype, in prototype order. The chunk candidates come from the
// chunk pass's dots with the chunk means (`local`, scaled by 1/||mu_j||; recomputed against the
// prototype for the <= p chunks that lost irregular tokens), so they equal Eq. 17's dots up to
// float rounding, not bit for bit. A bucket b is skipped where the triangle inequality on angles
// shows it cannot beat the token's own chunk: angle(c_m, b) > 2 angle(k, c_m) (with a 1e-3
// margin on the cosine). Tokens with no candidate get the exact assignment. `chunk_sums` are the
// sums after Eq. 11's subtraction of the irregular keys; `norms` are ||k_t||. Returns the number
// of bucket dots computed (a diagnostic of the pruning).
int64_t assign_locally(const float* keys, int64_t n, int d, const float* norms,
                       const float* chunk_sums, const LocalDots& local, const Clustering& clusters,
                       int32_t* out);

// Builds the prototypes of `config.prototypes` from keys [n, d] (raw, post-RoPE) and assigns every
// token. With no usable prototype (all keys zero) every token lands in cluster 0.
// `precomputed`, if given, is chunk_pass's result for these keys with config.chunks chunks (used
// for prototypes=hybrid with deviation=chunk; ignored otherwise): the same clustering, without
// reading the keys for the pass again.
Clustering cluster_keys(const float* keys, int64_t n, int d, const ClusteringConfig& config,
                        const ChunkPassResult* precomputed = nullptr);

}  // namespace protokv::press
