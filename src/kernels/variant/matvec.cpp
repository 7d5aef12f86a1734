// SPDX-License-Identifier: Apache-2.0
// Mat-vec for decode: y = W x, W in any supported dtype. Memory-bound: each weight byte is
// read once, rows are split across threads in contiguous static chunks so that each thread
// streams its own region. The K-quants multiply int8-quantised activations in integer
// arithmetic, as ggml does (quant_matvec.h); Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 with ggml's own Q8_0 / Q8_1
// activation blocks and vec_dot arithmetic, F16 against the activation rounded to F16 in
// ggml_vec_dot_f16's order, so that their rows round as llama.cpp's do.
#include <vector>

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

}  // namespace

namespace PROTOKV_KERNEL_VARIANT {

void matvec_rows(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  if (n <= 0) return;
  matvec_impl<VariantOps>(w, x, n, y);
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
