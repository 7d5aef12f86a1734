// SPDX-License-Identifier: Apache-2.0
// Mat-vec for decode: y = W x, W in any supported dtype. Memory-bound: each weight byte is
// read once, rows are split across threads in contiguous static chunks so that each thread
// streams its own region. The K-quants multiply int8-quantised activations in integer
// arithmetic, as ggml does (quant_matvec.h); Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 with ggml's own Q8_0 / Q8_1
// activation blocks and vec_dot arithmetic, F16 against the activation rounded to F16 in
// ggml_vec_dot_f16's order, so that their rows round as llama.cpp's do.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/quant_blocks.h"
#include "kernels/kernels.h"
#include "kernels/quant_matvec.h"
#include "kernels/simd.h"
#include "kernels/variant.h"
#include "protokv/error.h"

namespace protokv::kernels {
namespace {

// Below this many weight bytes the fork/join costs more than a second thread saves.
constexpr size_t kParallelMinBytes = size_t{1} << 17;

// y[i * w.rows + r] = row_dot(row r, i) for each of the n activations i: a weight row is read
// once and dotted with every activation while it is in cache.
template <class RowDot>
void for_each_row(const WeightMatrix& w, int64_t n, float* y, RowDot row_dot) {
  const auto* base = static_cast<const char*>(w.data);
  const size_t row_bytes = dtype_row_bytes(w.type, w.cols);
  const int64_t rows = w.rows;
#pragma omp parallel for schedule(static) if (w.bytes() >= kParallelMinBytes)
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = base + static_cast<size_t>(r) * row_bytes;
    for (int64_t i = 0; i < n; ++i) y[i * rows + r] = row_dot(row, i);
  }
}

// As for_each_row, `kRows` rows at a time (w.rows a multiple of kRows): group_dot(first row,
// activation i, out) writes the group's kRows results to out.
template <int kRows, class GroupDot>
void for_each_row_group(const WeightMatrix& w, int64_t n, float* y, GroupDot group_dot) {
  const auto* base = static_cast<const char*>(w.data);
  const size_t row_bytes = dtype_row_bytes(w.type, w.cols);
  const int64_t rows = w.rows;
#pragma omp parallel for schedule(static) if (w.bytes() >= kParallelMinBytes)
  for (int64_t g = 0; g < rows / kRows; ++g) {
    const char* first = base + static_cast<size_t>(g * kRows) * row_bytes;
    for (int64_t i = 0; i < n; ++i) {
      float out[kRows];
      group_dot(first, i, out);
      for (int k = 0; k < kRows; ++k) y[i * rows + g * kRows + k] = out[k];
    }
  }
}

// The calling thread's quantised activations, one per row (reused: decode calls matvec hundreds
// of times per token).
std::vector<QuantizedActivation>& activation_scratch(int64_t n) {
  thread_local std::vector<QuantizedActivation> scratch;
  if (static_cast<int64_t>(scratch.size()) < n) scratch.resize(static_cast<size_t>(n));
  return scratch;
}

template <class Ops>
void matvec_impl(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols;
  auto x_row = [&](int64_t i) { return x + i * cols; };
  switch (w.type) {
    case DType::F32:
      for_each_row(w, n, y, [&](const void* row, int64_t i) {
        return Ops::dot(static_cast<const float*>(row), x_row(i), cols);
      });
      return;
    case DType::F16: {
      // As llama.cpp: the activation rounded to F16 once (kept as F32 values, which are exact),
      // then each row in ggml_vec_dot_f16's order (Ops::dot_f16). (A pointer, not the
      // thread_local's name, goes into the parallel loop: each thread would see its own vector.)
      thread_local std::vector<float> rounded_scratch;
      rounded_scratch.resize(static_cast<size_t>(n * cols));
      float* rounded = rounded_scratch.data();
      Ops::round_to_f16(x, rounded, n * cols);
      for_each_row(w, n, y, [&](const void* row, int64_t i) {
        return Ops::dot_f16(static_cast<const uint16_t*>(row), rounded + i * cols, cols);
      });
      return;
    }
    case DType::BF16:
      for_each_row(w, n, y, [&](const void* row, int64_t i) {
        return Ops::dot_bf16(static_cast<const uint16_t*>(row), x_row(i), cols);
      });
      return;
    case DType::Q8_0: {
      const int64_t n_blocks = cols / kQ8BlockSize;
      std::vector<QuantizedActivation>& xq = activation_scratch(n);
      // ggml's own Q8_0 activation blocks: with them the kernel's arithmetic is ggml's
      // ggml_vec_dot_q8_0_q8_0 and a row rounds as llama.cpp's.
      for (int64_t i = 0; i < n; ++i) quantize_activation_ggml_q8(x_row(i), cols, false, xq[i]);
      for_each_row(w, n, y, [&](const void* row, int64_t i) {
        return Ops::dot_q8_0_int8(static_cast<const BlockQ8_0*>(row), xq[i].q.data(),
                                  xq[i].scale.data(), n_blocks);
      });
      return;
    }
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1: {
      // Legacy 32-value blocks against ggml's Q8_0 / Q8_1 activation blocks with ggml's vec_dot
      // arithmetic, so that decode rounds as llama.cpp does. Measured (BM_MatvecLegacy in
      // bench/bench_kernels.cpp: one thread, 2816 x 1024, AVX2 on a Zen 3, machine otherwise
      // quiet): Q4_0 212 us, Q4_1 209, Q5_0 226, Q5_1 230, against 2945, 2625, 3165 and 4319 us
      // for the path before, which dequantised each row to F32 and dotted it with x.
      const int64_t n_blocks = cols / kQ4BlockSize;
      const bool q8_1 = w.type == DType::Q4_1 || w.type == DType::Q5_1;
      std::vector<QuantizedActivation>& xq = activation_scratch(n);
      for (int64_t i = 0; i < n; ++i) quantize_activation_ggml_q8(x_row(i), cols, q8_1, xq[i]);
      switch (w.type) {
        case DType::Q4_0:
          if constexpr (requires { &Ops::dot8_q4_0_q8_0; }) {
            if (w.rows % 8 == 0) {  // llama.cpp's arithmetic for such matrices (dot8_q4_0_q8_0)
              const int64_t stride = static_cast<int64_t>(dtype_row_bytes(w.type, cols)) /
                                     static_cast<int64_t>(sizeof(BlockQ4_0));
              for_each_row_group<8>(w, n, y, [&](const void* rows, int64_t i, float* out) {
                Ops::dot8_q4_0_q8_0(static_cast<const BlockQ4_0*>(rows), stride, xq[i].q.data(),
                                    xq[i].scale.data(), xq[i].sums.data(), n_blocks, out);
              });
              return;
            }
          }
          for_each_row(w, n, y, [&](const void* row, int64_t i) {
            return Ops::dot_q4_0_q8_0(static_cast<const BlockQ4_0*>(row), xq[i].q.data(),
                                      xq[i].scale.data(), n_blocks);
          });
          return;
        case DType::Q5_0:
          for_each_row(w, n, y, [&](const void* row, int64_t i) {
            return Ops::dot_q5_0_q8_0(static_cast<const BlockQ5_0*>(row), xq[i].q.data(),
                                      xq[i].scale.data(), n_blocks);
          });
          return;
        case DType::Q4_1:
          for_each_row(w, n, y, [&](const void* row, int64_t i) {
            return Ops::dot_q4_1_q8_1(static_cast<const BlockQ4_1*>(row), xq[i].q.data(),
                                      xq[i].scale.data(), xq[i].s.data(), n_blocks);
          });
          return;
        default:  // Q5_1
          for_each_row(w, n, y, [&](const void* row, int64_t i) {
            return Ops::dot_q5_1_q8_1(static_cast<const BlockQ5_1*>(row), xq[i].q.data(),
                                      xq[i].scale.data(), xq[i].s.data(), n_blocks);
          });
          return;
      }
    }
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      // The K-quants, unpacked in registers where the instruction set has kernels for them (the
      // same integer sums as the generic path below; bench/bench_kernels.cpp BM_Matvec); the
      // portable build takes the generic path.
      if constexpr (requires { &Ops::template dot_kquant_q8_K<BlockQ4_K>; }) {
        const int64_t n_blocks = cols / kQkK;
        std::vector<QuantizedActivation>& xq = activation_scratch(n);
        for (int64_t i = 0; i < n; ++i) quantize_activation(x_row(i), cols, kQkK, xq[i]);
        with_unpacker(w.type, [&](auto unpack) {  // only for its block type
          using Unpack = decltype(unpack);
          if constexpr (Unpack::kValues == kQkK) {  // instantiated for the K-quants only
            for_each_row(w, n, y, [&](const void* row, int64_t i) {
              return Ops::dot_kquant_q8_K(static_cast<const typename Unpack::Block*>(row),
                                          xq[i].q.data(), xq[i].scale.data(), xq[i].sums.data(),
                                          n_blocks);
            });
          }
        });
        return;
      }
      [[fallthrough]];
    default:  // K-quants, portable build
      with_unpacker(w.type, [&](auto unpack) {
        using Unpack = decltype(unpack);
        const int64_t n_blocks = cols / Unpack::kValues;
        std::vector<QuantizedActivation>& xq = activation_scratch(n);
        for (int64_t i = 0; i < n; ++i) quantize_activation(x_row(i), cols, Unpack::kValues, xq[i]);
        for_each_row(w, n, y, [&](const void* row, int64_t i) {
          return dot_quantized_row<Ops, Unpack>(row, n_blocks, xq[i]);
        });
      });
      return;
  }
}

// (The helpers below serve the vector variants' tiles only: the portable build leaves them unused.)
// The activations of several rows (prompt rows, or sequences' decode rows) of a legacy matrix,
// quantised once to ggml's Q8_0 / Q8_1 blocks: q [n][cols], d and s [n][blocks], and per block the
// lane inits of Ops::legacy_lanes_tile
// (-offset * the sum of each lane's 4 values) or Ops::q4_0_rows8_tokens (-8 * the block's sum).
struct PrefillActivations {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> lane_init, block_neg8;
};

[[maybe_unused]] PrefillActivations quantize_prefill_activations(const float* x, int64_t n,
                                                                 int64_t cols, bool q8_1,
                                                                 int offset, bool lane_inits) {
  const int64_t n_blocks = cols / kQ8BlockSize;
  PrefillActivations a;
  a.q.resize(static_cast<size_t>(n * cols));
  a.d.resize(static_cast<size_t>(n * n_blocks));
  a.s.resize(q8_1 ? static_cast<size_t>(n * n_blocks) : 0);
  a.lane_init.resize(lane_inits ? static_cast<size_t>(n * n_blocks * 8) : 0);
  a.block_neg8.resize(lane_inits ? 0 : static_cast<size_t>(n * n_blocks));
#pragma omp parallel if (n * cols >= (1 << 15))
  {
    QuantizedActivation token;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      quantize_activation_ggml_q8(x + t * cols, cols, q8_1, token);
      std::copy(token.q.begin(), token.q.end(), a.q.begin() + t * cols);
      for (int64_t b = 0; b < n_blocks; ++b) {
        const auto at = static_cast<size_t>(t * n_blocks + b);
        a.d[at] = token.scale[static_cast<size_t>(b)];
        if (q8_1) a.s[at] = token.s[static_cast<size_t>(b)];
        const int8_t* qb = token.q.data() + 32 * b;
        if (lane_inits) {
          for (int l = 0; l < 8; ++l)
            a.lane_init[at * 8 + static_cast<size_t>(l)] =
                -offset * (qb[4 * l] + qb[4 * l + 1] + qb[4 * l + 2] + qb[4 * l + 3]);
        } else {
          a.block_neg8[at] = -8 * (token.sums[static_cast<size_t>(2 * b)] +
                                   token.sums[static_cast<size_t>(2 * b + 1)]);
        }
      }
    }
  }
  return a;
}

// Q4_0 rows r0 .. r0 + 7 unpacked as Ops::q4_0_rows8_tokens takes them: per block 8 groups of
// [8 rows][4 bytes], group 2k the low nibbles of bytes 4k .. 4k + 3 (values 4k ..), group 2k + 1
// their high nibbles (values 16 + 4k ..); dw [blocks][8] the rows' scales in F32.
[[maybe_unused]] void pack_q4_0_rows8(const WeightMatrix& w, int64_t r0, uint8_t* panel,
                                      float* dw) {
  const int64_t n_blocks = w.cols / kQ4BlockSize;
  for (int64_t i = 0; i < 8; ++i) {
    const auto* blocks = static_cast<const BlockQ4_0*>(w.row(r0 + i));
    for (int64_t b = 0; b < n_blocks; ++b) {
      dw[8 * b + i] = f16_to_f32(blocks[b].d);
      uint8_t* groups = panel + 256 * b;
      for (int k = 0; k < 4; ++k)
        for (int m = 0; m < 4; ++m) {
          const uint8_t byte = blocks[b].qs[4 * k + m];
          groups[(2 * k) * 32 + 4 * i + m] = byte & 0x0f;
          groups[(2 * k + 1) * 32 + 4 * i + m] = byte >> 4;
        }
    }
  }
}

// Several activation rows of a Q4_0 matrix of a multiple of 8 rows, each (row, token) exactly as
// one mat-vec computes it (Ops::dot8_q4_0_q8_0, llama.cpp's repacked 8-row arithmetic, whose
// prompt batches round the same way: measured bit-equal). The activations are quantised once to
// ggml's Q8_0 blocks; each thread unpacks its 8-row panels once and runs them against every token,
// a tile of Ops::kQ4_0PrefillTokens tokens at a time.
template <class Ops>
void rows_q4_0_tiles(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, rows = w.rows, n_blocks = cols / kQ4BlockSize;
  constexpr int kTokens = Ops::kQ4_0PrefillTokens;
  const PrefillActivations a = quantize_prefill_activations(x, n, cols, false, 8, false);
#pragma omp parallel if (w.bytes() >= kParallelMinBytes)
  {
    std::vector<uint8_t> panel(static_cast<size_t>(256 * n_blocks));
    std::vector<float> dw(static_cast<size_t>(8 * n_blocks));
    float out[8 * kTokens];
#pragma omp for schedule(static)
    for (int64_t g = 0; g < rows / 8; ++g) {
      pack_q4_0_rows8(w, 8 * g, panel.data(), dw.data());
      auto tile = [&]<int T>(int64_t t0) {
        Ops::template q4_0_rows8_tokens<T>(panel.data(), dw.data(), a.q.data() + t0 * cols, cols,
                                           a.d.data() + t0 * n_blocks,
                                           a.block_neg8.data() + t0 * n_blocks, n_blocks, out);
        for (int i = 0; i < T; ++i)
          std::copy(out + 8 * i, out + 8 * i + 8, y + (t0 + i) * rows + 8 * g);
      };
      int64_t t0 = 0;
      for (; t0 + kTokens <= n; t0 += kTokens) tile.template operator()<kTokens>(t0);
      for (; t0 < n; ++t0) tile.template operator()<1>(t0);
    }
  }
}

// Rows r0 .. r0 + count - 1 of a legacy matrix unpacked as Ops::legacy_lanes_tile takes them:
// 32 bytes per block (Q8_0: its int8 values; the others: their unsigned values q, value =
// q - offset), scales and (Q4_1 / Q5_1) mins in F32, [row][block].
[[maybe_unused]] void pack_legacy_rows(const WeightMatrix& w, int64_t r0, int64_t count,
                                       uint8_t* values, float* dw, float* wm) {
  const int64_t n_blocks = w.cols / kQ8BlockSize;
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* row_values = values + i * w.cols;
    if (w.type == DType::Q8_0) {
      const auto* blocks = static_cast<const BlockQ8_0*>(w.row(r0 + i));
      for (int64_t b = 0; b < n_blocks; ++b) {
        std::memcpy(row_values + 32 * b, blocks[b].quants, 32);
        dw[i * n_blocks + b] = f16_to_f32(blocks[b].scale);
      }
      continue;
    }
    quant::with_unpacker(w.type, [&](auto unpack) {
      using Unpack = decltype(unpack);
      const auto* blocks = static_cast<const typename Unpack::Block*>(w.row(r0 + i));
      quant::UnpackedBlock u;
      for (int64_t b = 0; b < n_blocks; ++b) {
        Unpack::unpack(blocks[b], u);
        std::memcpy(row_values + 32 * b, u.q, 32);
        dw[i * n_blocks + b] = u.d;
        wm[i * n_blocks + b] = -u.m;  // UnpackedBlock's m is minus the min (value = d q - m)
      }
    });
  }
}

// Several activation rows of a legacy matrix (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; Q4_0 of a multiple of
// 8 rows takes rows_q4_0_tiles): each (row, token) exactly as one mat-vec computes it (ggml's
// vec_dot arithmetic, which llama.cpp's prompt batches round as its decode does: measured
// bit-equal), tiles of
// Ops::kLegacyPrefillRows rows by kLegacyPrefillTokens tokens over rows unpacked once.
template <class Ops>
void rows_legacy_lane_tiles(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, rows = w.rows, n_blocks = cols / kQ8BlockSize;
  const bool q8_1 = w.type == DType::Q4_1 || w.type == DType::Q5_1;
  const bool is_signed = w.type == DType::Q8_0;
  // Q8_0's offset serves the AVX-512 tiles, which make its int8 values unsigned by +128.
  const int offset = w.type == DType::Q4_0   ? 8
                     : w.type == DType::Q5_0 ? 16
                     : w.type == DType::Q8_0 ? 128
                                             : 0;
  const PrefillActivations a = quantize_prefill_activations(x, n, cols, q8_1, offset, true);
  constexpr int kRows = Ops::kLegacyPrefillRows, kTokens = Ops::kLegacyPrefillTokens;
  const int64_t groups = (rows + kRows - 1) / kRows;
#pragma omp parallel if (w.bytes() >= kParallelMinBytes)
  {
    std::vector<uint8_t> values(static_cast<size_t>(kRows * cols));
    std::vector<float> dw(static_cast<size_t>(kRows * n_blocks)),
        wm(static_cast<size_t>(kRows * n_blocks));
    float out[kRows * kTokens];
    auto run = [&]<int R, int T>(int64_t r0, int64_t t0) {
      const int8_t* xt = a.q.data() + t0 * cols;
      const float* dt = a.d.data() + t0 * n_blocks;
      const float* st = q8_1 ? a.s.data() + t0 * n_blocks : nullptr;
      const int32_t* it = a.lane_init.data() + t0 * n_blocks * 8;
      if (is_signed)
        Ops::template legacy_lanes_tile<R, T, true, false>(
            values.data(), cols, dw.data(), wm.data(), xt, cols, dt, st, it, n_blocks, out);
      else if (q8_1)
        Ops::template legacy_lanes_tile<R, T, false, true>(
            values.data(), cols, dw.data(), wm.data(), xt, cols, dt, st, it, n_blocks, out);
      else
        Ops::template legacy_lanes_tile<R, T, false, false>(
            values.data(), cols, dw.data(), wm.data(), xt, cols, dt, st, it, n_blocks, out);
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) y[(t0 + t) * rows + r0 + r] = out[r * T + t];
    };
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t r0 = g * kRows, count = std::min<int64_t>(kRows, rows - r0);
      pack_legacy_rows(w, r0, count, values.data(), dw.data(), wm.data());
      int64_t t0 = 0;
      if (count == kRows) {
        for (; t0 + kTokens <= n; t0 += kTokens) run.template operator()<kRows, kTokens>(r0, t0);
        for (; t0 < n; ++t0) run.template operator()<kRows, 1>(r0, t0);
      } else {  // the last rows of a matrix of rows % kRows != 0: one at a time
        for (int64_t r = 0; r < count; ++r) {
          if (r > 0) pack_legacy_rows(w, r0 + r, 1, values.data(), dw.data(), wm.data());
          for (t0 = 0; t0 < n; ++t0) run.template operator()<1, 1>(r0 + r, t0);
        }
      }
    }
  }
}

// Several rows of a legacy matrix: register tiles over rows unpacked once, each (row, token)
// rounded as matvec_impl rounds it (the portable variant runs matvec_impl itself).
template <class Ops>
void matvec_rows_impl(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  if constexpr (requires { Ops::kQ4_0PrefillTokens; }) {
    if (n >= 2) {
      if (w.type == DType::Q4_0 && w.rows % 8 == 0) return rows_q4_0_tiles<Ops>(w, x, n, y);
      if (dtype_is_legacy_quant(w.type)) return rows_legacy_lane_tiles<Ops>(w, x, n, y);
    }
  }
  matvec_impl<Ops>(w, x, n, y);
}

// Rows as llama.cpp multiplies them (kernels.h): in a batch, F32 and F16 by tinyBLAS's order
// where its shapes allow, else (and one by one) ggml_vec_dot_f32's / ggml_vec_dot_f16's; legacy
// quants as mat-vecs; the other types of a batch by matmul.
template <class Ops>
void matmul_as_llama_cpp_impl(const WeightMatrix& w, const float* x, int64_t n, float* y,
                              bool batched) {
  constexpr int lanes = Ops::kTinyBlasLanes;
  const bool tinyblas = lanes > 0 && batched && w.cols % lanes == 0 && w.rows % 4 == 0;
  if (w.type == DType::F32) {
    for_each_row(w, n, y, [&](const void* row, int64_t i) {
      const auto* weights = static_cast<const float*>(row);
      return tinyblas ? Ops::tinyblas_dot_f32(weights, x + i * w.cols, w.cols)
                      : Ops::dot_f32_as_ggml(weights, x + i * w.cols, w.cols);
    });
    return;
  }
  if (tinyblas && w.type == DType::F16) {
    thread_local std::vector<float> rounded_scratch;  // as in matvec_impl
    rounded_scratch.resize(static_cast<size_t>(n * w.cols));
    float* rounded = rounded_scratch.data();
    Ops::round_to_f16(x, rounded, n * w.cols);
    for_each_row(w, n, y, [&](const void* row, int64_t i) {
      return Ops::tinyblas_dot_f16(static_cast<const uint16_t*>(row), rounded + i * w.cols, w.cols);
    });
    return;
  }
  if (!batched || w.type == DType::F16 || dtype_is_legacy_quant(w.type))
    return matvec_rows_impl<Ops>(w, x, n, y);
  PROTOKV_KERNEL_VARIANT::matmul(w, x, n, y);
}

}  // namespace

namespace PROTOKV_KERNEL_VARIANT {

void matvec_rows(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  if (n <= 0) return;
  matvec_rows_impl<VariantOps>(w, x, n, y);
}

void matmul_as_llama_cpp(const WeightMatrix& w, const float* x, int64_t n, float* y, bool batched) {
  if (n <= 0) return;
  matmul_as_llama_cpp_impl<VariantOps>(w, x, n, y, batched);
}

float legacy_quant_dot(DType type, const void* row, const QuantizedActivation& x, int64_t cols) {
  const int64_t n = cols / kQ4BlockSize;
  switch (type) {
    case DType::Q4_0:
      return VariantOps::dot_q4_0_q8_0(static_cast<const BlockQ4_0*>(row), x.q.data(),
                                       x.scale.data(), n);
    case DType::Q5_0:
      return VariantOps::dot_q5_0_q8_0(static_cast<const BlockQ5_0*>(row), x.q.data(),
                                       x.scale.data(), n);
    case DType::Q4_1:
      return VariantOps::dot_q4_1_q8_1(static_cast<const BlockQ4_1*>(row), x.q.data(),
                                       x.scale.data(), x.s.data(), n);
    case DType::Q5_1:
      return VariantOps::dot_q5_1_q8_1(static_cast<const BlockQ5_1*>(row), x.q.data(),
                                       x.scale.data(), x.s.data(), n);
    default:
      fail("legacy_quant_dot: {} is not a legacy quantised type", dtype_name(type));
  }
}

}  // namespace PROTOKV_KERNEL_VARIANT
}  // namespace protokv::kernels
