// SPDX-License-Identifier: Apache-2.0
#pragma once
// The inner loops of ProtoKV's clustering (ProtoKV §4.1-4.3; press/protokv_clustering.h has the
// algorithm around them): the chunk pass, the dots of rows with one vector and the exact prototype
// assignment (Eq. 17). Compiled once per instruction set like every kernel
// (kernels/variant/clustering.cpp); the AVX-512 variant has register-blocked versions for
// head_dim 64, 128 and 256, the others run the plain loops, which the compiler vectorises.
#include <cstdint>

#include "kernels/isa.h"

namespace protokv::kernels {

// Chunk m of k over n tokens is [m*n/k, (m+1)*n/k): consecutive, sizes floor(n/k) or ceil(n/k),
// every token in exactly one chunk.
inline int64_t chunk_begin(int64_t m, int64_t n, int64_t k) {
  return m * n / k;
}

// assign=local's chunk candidates, computed by the chunk pass while each chunk's rows are in
// cache: slot i of token t (in chunk m) holds k_t . mu_j for j = m - reach + i, the dot with the
// MEAN of chunk j as the pass computes it (sum times 1/count), for 0 <= j < k (other slots are not
// written). Planar: dots [2 reach + 1, n], slot i of token t at dots[i * n + t]. For a chunk that
// keeps all its tokens, k . c_j = (k . mu_j) / ||mu_j||: one read of the keys gives both Eq. 10's
// cosines (slot `reach`) and the local candidates.
struct LocalDots {
  float* dots = nullptr;  // null: not wanted
  int reach = 0;
  int slots() const { return 2 * reach + 1; }
};

// The chunk pass (press::chunk_pass's contract) over the chunks [m_begin, m_end) of k.
void chunk_pass_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                      int64_t m_end, float* norms, float* chunk_sums, float* delta,
                      const LocalDots& local);
void chunk_pass_range(Isa isa, const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                      int64_t m_end, float* norms, float* chunk_sums, float* delta,
                      const LocalDots& local);

// out[t] = rows[t] . vec for the rows [begin, end) of rows [*, d].
void rows_dot(const float* rows, int64_t begin, int64_t end, int d, const float* vec, float* out);

// ProtoKV Eq. 17 (press::assign_to_prototypes's contract).
void assign_to_prototypes(const float* keys, int64_t n, int d, const float* prototypes, int count,
                          int32_t* out);
void assign_to_prototypes(Isa isa, const float* keys, int64_t n, int d, const float* prototypes,
                          int count, int32_t* out);

}  // namespace protokv::kernels
