// SPDX-License-Identifier: Apache-2.0
// Mat-mul for prefill: Y[n, rows] = X[n, cols] · W^T through BLAS sgemm.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/simd.h"
#include "kernels/variant.h"

namespace protokv::kernels {
namespace {

// Fewer tokens than this: a GEMM would re-read W per token anyway, matvec streams it better.
constexpr int64_t kMinGemmTokens = 4;
// F32 scratch per panel of converted rows (4 MB: 256 rows of 4096). Each sgemm call re-packs X,
// so larger panels amortise that better; measured single-threaded at n = 512, dim = 4096, F16
// went from 67% of the F32 sgemm rate with 32-row panels to 93% with 256-row panels.
constexpr int64_t kPanelFloats = int64_t{1} << 20;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Rows per panel: at most kPanelFloats of them (16 to 512 rows), and, when each thread can have
// 16 rows, as many panels as a whole multiple of the threads, of sizes within one row of each
// other. A thread's share is then whole panels of equal work: with the largest panels instead, a
// 1024-row matrix of 2816 columns made 368 + 368 + 288 rows and one of two threads waited a third
// of the time, and a matrix of one panel converted its rows on one thread (measured: the OpenMP
// wait was 11% of a 512-token prefill of a Q4_K_M file on 2 threads).
int64_t panel_rows_for(int64_t rows, int64_t cols, int64_t threads) {
  const int64_t max_rows =
      std::clamp<int64_t>(kPanelFloats / std::max<int64_t>(cols, 1) / 16 * 16, 16, 512);
  int64_t n_panels = ceil_div(rows, max_rows);
  if (rows >= 16 * threads) n_panels = ceil_div(n_panels, threads) * threads;
  return ceil_div(rows, n_panels);  // <= max_rows
}

// Y[:, r0 : r0 + panel_rows] = X · panel^T; panel [panel_rows, cols].
void sgemm_xwt(const float* x, int64_t n, int64_t cols, const float* w, int64_t w_rows, float* y,
               int64_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
              static_cast<int>(w_rows), static_cast<int>(cols), 1.0f, x, static_cast<int>(cols), w,
              static_cast<int>(cols), 0.0f, y, static_cast<int>(ldy));
}

template <class Ops>
void matmul_converted(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols;
  const int64_t panel_rows = panel_rows_for(w.rows, cols, std::max(omp_get_max_threads(), 1));
  const int64_t n_panels = ceil_div(w.rows, panel_rows);
  // Each thread converts and multiplies whole panels; its sgemm runs single-threaded inside the
  // parallel region. A single panel instead runs serially here and lets BLAS use the threads.
#pragma omp parallel if (n_panels > 1)
  {
    std::vector<float> panel(static_cast<size_t>(panel_rows * cols));  // [panel_rows, cols]
#pragma omp for schedule(dynamic, 1)
    for (int64_t p = 0; p < n_panels; ++p) {
      const int64_t r0 = p * panel_rows;
      const int64_t count = std::min(panel_rows, w.rows - r0);
      for (int64_t r = 0; r < count; ++r)
        Ops::to_f32(w.type, w.row(r0 + r), &panel[r * cols], cols);
      sgemm_xwt(x, n, cols, panel.data(), count, y + r0, w.rows);
    }
  }
}

template <class Ops>
void matmul_impl(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  if (w.cols <= 0) {  // empty sum (and BLAS rejects a zero leading dimension)
    std::fill(y, y + n * w.rows, 0.0f);
    return;
  }
  // Quantised and F16 weights: mat-vec rounds the activations (to int8, to F16) as llama.cpp's
  // decode does, so only a single row takes it; several rows stay on the F32-activation path
  // (closer to the F32 model) and a prompt gives the same result whatever its chunking (a last
  // chunk of 2 rows included).
  const bool matvec_rounds_activations = dtype_block_size(w.type) > 1 || w.type == DType::F16;
  if (n == 1 || (n < kMinGemmTokens && !matvec_rounds_activations)) {
    PROTOKV_KERNEL_VARIANT::matvec_rows(w, x, n, y);  // each row as matvec(w, x + i * cols)
    return;
  }
  if (w.type == DType::F32) {
    sgemm_xwt(x, n, w.cols, static_cast<const float*>(w.data), w.rows, y, w.rows);
    return;
  }
  matmul_converted<Ops>(w, x, n, y);
}

}  // namespace

namespace PROTOKV_KERNEL_VARIANT {

void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  matmul_impl<VariantOps>(w, x, n, y);
}

void weight_row_to_f32(DType type, const void* row, float* out, int64_t n) {
  VariantOps::to_f32(type, row, out, n);
}

}  // namespace PROTOKV_KERNEL_VARIANT
}  // namespace protokv::kernels
