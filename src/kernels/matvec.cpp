// Mat-vec for decode: y = W x, W in F32 / F16 / BF16 / Q8_0. Memory-bound: each weight byte is
// read once, rows are split across threads in contiguous static chunks so that each thread
// streams its own region.
#include <vector>

#include "kernels/isa.h"
#include "kernels/kernels.h"

namespace protokv::kernels {
namespace {

// Below this many weight bytes the fork/join costs more than a second thread saves.
constexpr size_t kParallelMinBytes = size_t{1} << 17;

template <class RowDot>
void for_each_row(const WeightMatrix& w, float* y, RowDot row_dot) {
  const auto* base = static_cast<const char*>(w.data);
  const size_t row_bytes = dtype_row_bytes(w.type, w.cols);
#pragma omp parallel for schedule(static) if (w.bytes() >= kParallelMinBytes)
  for (int64_t r = 0; r < w.rows; ++r) y[r] = row_dot(base + static_cast<size_t>(r) * row_bytes);
}

template <class Ops>
void matvec_impl(const WeightMatrix& w, const float* x, float* y) {
  const int64_t cols = w.cols;
  switch (w.type) {
    case DType::F32:
      for_each_row(
          w, y, [&](const void* row) { return Ops::dot(static_cast<const float*>(row), x, cols); });
      return;
    case DType::F16:
      for_each_row(w, y, [&](const void* row) {
        return Ops::dot_f16(static_cast<const uint16_t*>(row), x, cols);
      });
      return;
    case DType::BF16:
      for_each_row(w, y, [&](const void* row) {
        return Ops::dot_bf16(static_cast<const uint16_t*>(row), x, cols);
      });
      return;
    case DType::Q8_0: {
      const int64_t n_blocks = cols / kQ8BlockSize;
      for_each_row(w, y, [&](const void* row) {
        return Ops::dot_q8(static_cast<const BlockQ8_0*>(row), x, n_blocks);
      });
      return;
    }
  }
}

}  // namespace

void matvec(Isa isa, const WeightMatrix& w, const float* x, float* y) {
  with_isa(isa, [&](auto ops) { matvec_impl<decltype(ops)>(w, x, y); });
}

void matvec(const WeightMatrix& w, const float* x, float* y) {
  matvec(kBestIsa, w, x, y);
}

}  // namespace protokv::kernels
