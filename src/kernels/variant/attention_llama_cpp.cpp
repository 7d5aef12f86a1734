// SPDX-License-Identifier: Apache-2.0
// llama.cpp's attention and SwiGLU arithmetic at SIMD speed: what kernels/llama_cpp_order.h's
// portable functions compute for this variant's instruction set, to the bit (tests/
// test_llama_cpp_order.cpp), with the dot products and exponentials in vector registers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/llama_cpp_order.h"
#include "kernels/simd.h"
#include "kernels/variant.h"

namespace protokv::kernels {
namespace {

// The lanes of one vector reduced as ggml_vec_soft_max_f32 and tinyBLAS's hsum do (GCC's
// _mm512_reduce_add_ps; the AVX2 hsum): upper half plus lower half down to four lanes, then
// (l0 + l2) + (l1 + l3). Here each "lane" is a row of d values (one per output value).
[[maybe_unused]] void horizontal_sum_rows(float* lanes, int count, int d, float* out) {
  for (int width = count / 2; width >= 4; width /= 2)
    for (int l = 0; l < width; ++l) {
      float* a = lanes + static_cast<int64_t>(l) * d;
      const float* b = lanes + static_cast<int64_t>(l + width) * d;
      for (int i = 0; i < d; ++i) a[i] = b[i] + a[i];
    }
  const float* l0 = lanes;
  const float* l1 = lanes + d;
  const float* l2 = lanes + 2 * static_cast<int64_t>(d);
  const float* l3 = lanes + 3 * static_cast<int64_t>(d);
  for (int i = 0; i < d; ++i) out[i] = (l0[i] + l2[i]) + (l1[i] + l3[i]);
}

// out[i] = sum over entries of values[e][i] * p[e] in ggml_vec_dot_f32's order (four
// accumulators of `lanes` lanes: slot e % (4 lanes)) or tinyBLAS's (one accumulator: slot
// e % lanes), each slot a row of d accumulators advanced with FMAs.
template <class Ops>
void weighted_values(const float* p, const float* values, int64_t n, int d, bool tinyblas,
                     float* out) {
  constexpr int lanes = Ops::kGgmlLanes;
  if constexpr (lanes == 0) {  // no SIMD: float products summed in double
    thread_local std::vector<double> sums;
    sums.assign(static_cast<size_t>(d), 0.0);
    for (int64_t e = 0; e < n; ++e)
      for (int i = 0; i < d; ++i) {
        const float product = values[e * d + i] * p[e];
        sums[static_cast<size_t>(i)] += static_cast<double>(product);
      }
    for (int i = 0; i < d; ++i) out[i] = static_cast<float>(sums[static_cast<size_t>(i)]);
  } else {
    const int slots = tinyblas ? lanes : 4 * lanes;
    thread_local std::vector<float> acc;  // [slots, d]
    acc.assign(static_cast<size_t>(slots) * static_cast<size_t>(d), 0.0f);
    for (int64_t e = 0; e < n; ++e) {
      float* a = acc.data() + (e % slots) * d;
      const float* v = values + e * d;
      const float weight = p[e];
      for (int i = 0; i < d; ++i) a[i] = std::fma(v[i], weight, a[i]);
    }
    float* rows = acc.data();
    if (!tinyblas) {  // GGML_F32_VEC_REDUCE: (s0 + s2) + (s1 + s3), lane by lane
      for (int l = 0; l < lanes; ++l) {
        float* s0 = rows + static_cast<int64_t>(l) * d;
        const float* s1 = s0 + static_cast<int64_t>(lanes) * d;
        const float* s2 = s1 + static_cast<int64_t>(lanes) * d;
        const float* s3 = s2 + static_cast<int64_t>(lanes) * d;
        for (int i = 0; i < d; ++i) s0[i] = (s0[i] + s2[i]) + (s1[i] + s3[i]);
      }
      if constexpr (Ops::kGgmlHaddReduce) {  // halves, then two _mm_hadd_ps
        for (int l = 0; l < 4; ++l) {
          float* a = rows + static_cast<int64_t>(l) * d;
          const float* b = rows + static_cast<int64_t>(l + 4) * d;
          for (int i = 0; i < d; ++i) a[i] = a[i] + b[i];
        }
        const float* t0 = rows;
        const float* t1 = rows + d;
        const float* t2 = rows + 2 * static_cast<int64_t>(d);
        const float* t3 = rows + 3 * static_cast<int64_t>(d);
        for (int i = 0; i < d; ++i) out[i] = (t0[i] + t1[i]) + (t2[i] + t3[i]);
        return;
      }
    }
    horizontal_sum_rows(rows, lanes, d, out);
  }
}

template <class Ops>
void attention_as_llama_cpp_impl(const float* q, const float* keys, const float* values, int64_t n,
                                 int d, float scale, bool batched, float* out) {
  thread_local std::vector<float> p;
  p.resize(static_cast<size_t>(n));
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < n; ++e) {
    const float dot = Ops::dot_f32_as_ggml(keys + e * d, q, d);
    p[static_cast<size_t>(e)] = dot * scale;
    max = std::max(max, p[static_cast<size_t>(e)]);
  }
  const auto inverse = static_cast<float>(1.0 / Ops::exp_sum_as_ggml(p.data(), max, n));
  for (float& value : p) value *= inverse;
  weighted_values<Ops>(p.data(), values, n, d, batched && d % 4 == 0, out);
}

// ggml's `y + x * v` loops: one FMA where its build contracts them (every SIMD build), a rounded
// product otherwise (this file is compiled with -ffp-contract=off).
template <class Ops>
float ggml_mad(float x, float v, float y) {
  if constexpr (Ops::kGgmlLanes != 0) {
    return std::fma(x, v, y);
  } else {
    const float product = x * v;
    return y + product;
  }
}

// ggml_vec_dot_f16 of F16 values held as floats: ggml_vec_dot_f32's vector part over the whole
// steps, the rest as float products (exact) added in double.
template <class Ops>
float dot_f16_values(const float* x, const float* y, int d) {
  constexpr int64_t step = 4 * int64_t{Ops::kGgmlLanes};
  const int64_t whole = step == 0 ? 0 : d / step * step;
  double sum = whole > 0 ? static_cast<double>(Ops::dot_f32_as_ggml(x, y, whole)) : 0.0;
  for (int64_t i = whole; i < d; ++i) {
    const float product = x[i] * y[i];
    sum += static_cast<double>(product);
  }
  return static_cast<float>(sum);
}

// ggml's online softmax state: the maximum M, the sum S (the unnormalised output is kept apart).
struct FlashSums {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;
};

// Row e of a cache's keys or values as flash attention reads it: F16 rows converted, F32 rows
// rounded to F16 when `f16` (llama.cpp casts an F32 cache to F16), else the row itself.
template <class Ops>
const float* flash_row(ValueRows rows, int64_t e, int d, bool f16, float* buffer) {
  if (rows.type == DType::F16) {
    PROTOKV_KERNEL_VARIANT::weight_row_to_f32(
        DType::F16, static_cast<const uint16_t*>(rows.data) + e * d, buffer, d);
    return buffer;
  }
  const float* row = static_cast<const float*>(rows.data) + e * d;
  if (!f16) return row;
  Ops::round_to_f16(row, buffer, d);
  return buffer;
}

// ggml_order::flash_attention's tiled path for `rows` causal query rows of one head (row r, at
// q + r * q_stride, over the first n_first + r entries), as ggml shares its tiles among a ubatch's
// rows: each tile of keys is converted and transposed once (simd_gemm's layout, so that the FMAs
// of 64 cells run side by side) and its values converted once, for every row that sees it. Each
// row's arithmetic is the one-row tiled path's. acc: [rows, d]; sums: [rows].
template <class Ops>
void flash_tiled_rows(const float* q, int64_t q_stride, int64_t rows, ValueRows keys,
                      ValueRows values, int64_t n_first, int d, float scale,
                      const LlamaCppFlashAttention& how, float* acc, FlashSums* sums) {
  constexpr int64_t tile = ggml_order::kFlashTileCells;
  thread_local std::vector<float> keys_t, values_tile, row_buffer;  // [d, tile], [tile, d], [d]
  keys_t.resize(static_cast<size_t>(d) * tile);
  values_tile.resize(static_cast<size_t>(d) * tile);
  row_buffer.resize(static_cast<size_t>(d));
  float p[tile];
  std::fill(acc, acc + rows * d, 0.0f);
  std::fill(sums, sums + rows, FlashSums{});
  const int64_t n_last = n_first + rows - 1;  // what the last row sees
  for (int64_t t0 = 0; t0 < n_last; t0 += tile) {
    const int64_t tile_cells = std::min(tile, n_last - t0);
    for (int64_t j = 0; j < tile_cells; ++j) {
      const float* key = flash_row<Ops>(keys, t0 + j, d, how.f16_keys, row_buffer.data());
      for (int i = 0; i < d; ++i) keys_t[i * tile + j] = key[i];
      const float* value =
          flash_row<Ops>(values, t0 + j, d, how.f16_values, values_tile.data() + j * d);
      if (value != values_tile.data() + j * d)
        std::copy(value, value + d, values_tile.data() + j * d);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t cells = std::min(tile, n_first + r - t0);  // this row's visible cells
      if (cells <= 0) continue;
      const float* qr = q + r * q_stride;
      float* a = acc + r * d;
      FlashSums& st = sums[r];
      std::fill(p, p + cells, 0.0f);
      for (int i = 0; i < d; ++i) {
        const float qi = qr[i];
        const float* row = keys_t.data() + i * tile;
        for (int64_t j = 0; j < cells; ++j) p[j] = ggml_mad<Ops>(qi, row[j], p[j]);
      }
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < cells; ++j) {
        p[j] *= scale;
        tile_max = std::max(tile_max, p[j]);
      }
      const float new_max = std::fmax(st.max, tile_max);
      if (new_max > st.max) {
        const float rescale = std::exp(st.max - new_max);
        for (int i = 0; i < d; ++i) a[i] *= rescale;
        st.sum *= rescale;
      }
      st.max = new_max;
      st.sum =
          static_cast<float>(static_cast<double>(st.sum) + Ops::exp_sum_as_ggml(p, st.max, cells));
      for (int64_t j = 0; j < cells; ++j) {
        const float* v = values_tile.data() + j * d;
        const float weight = p[j];
        for (int i = 0; i < d; ++i) a[i] = ggml_mad<Ops>(v[i], weight, a[i]);
      }
    }
  }
}

// ggml_order::flash_attention's one-chunk path over entries [first, first + n).
template <class Ops>
FlashSums flash_one_chunk(const float* q, ValueRows keys, ValueRows values, int64_t first,
                          int64_t n, int d, float scale, const LlamaCppFlashAttention& how,
                          float* acc) {
  thread_local std::vector<float> query, key_buffer, value_buffer;
  query.assign(q, q + d);
  key_buffer.resize(static_cast<size_t>(d));
  value_buffer.resize(static_cast<size_t>(d));
  if (how.f16_keys) Ops::round_to_f16(q, query.data(), d);
  FlashSums st;
  std::fill(acc, acc + d, 0.0f);
  for (int64_t e = first; e < first + n; ++e) {
    const float* key = flash_row<Ops>(keys, e, d, how.f16_keys, key_buffer.data());
    const float dot = how.f16_keys ? dot_f16_values<Ops>(key, query.data(), d)
                                   : Ops::dot_f32_as_ggml(key, query.data(), d);
    const float s = dot * scale;
    float rescale = 1.0f;
    float weight = 1.0f;
    if (s > st.max) {
      rescale = std::exp(st.max - s);
      st.max = s;
      for (int i = 0; i < d; ++i) acc[i] *= rescale;
      if (how.f16_values) Ops::round_to_f16(acc, acc, d);
    } else {
      weight = std::exp(s - st.max);
    }
    const float* v = flash_row<Ops>(values, e, d, how.f16_values, value_buffer.data());
    for (int i = 0; i < d; ++i) acc[i] = ggml_mad<Ops>(v[i], weight, acc[i]);
    if (how.f16_values) Ops::round_to_f16(acc, acc, d);
    st.sum = ggml_mad<Ops>(st.sum, rescale, weight);
  }
  return st;
}

// One row: the one-chunk path, or its split over llama.cpp's threads (ggml_order::
// flash_attention). acc [d] ends unnormalised.
template <class Ops>
FlashSums flash_one_row(const float* q, ValueRows keys, ValueRows values, int64_t n, int d,
                        float scale, const LlamaCppFlashAttention& how, float* acc) {
  const int64_t chunk = ggml_order::flash_attention_split(how, n);
  if (chunk == 0) return flash_one_chunk<Ops>(q, keys, values, 0, n, d, scale, how, acc);
  // Each of llama.cpp's threads' cells, merged in thread order.
  thread_local std::vector<float> part;
  part.resize(static_cast<size_t>(d));
  std::fill(acc, acc + d, 0.0f);
  FlashSums st;
  for (int64_t first = 0; first < n; first += chunk) {
    const FlashSums p = flash_one_chunk<Ops>(q, keys, values, first, std::min(chunk, n - first), d,
                                             scale, how, part.data());
    if (p.sum == 0.0f) continue;
    const float new_max = std::fmax(st.max, p.max);
    const float scale_old = std::exp(st.max - new_max);
    const float scale_new = std::exp(p.max - new_max);
    for (int i = 0; i < d; ++i) {
      const float fresh = part[static_cast<size_t>(i)] * scale_new;
      acc[i] = ggml_mad<Ops>(acc[i], scale_old, fresh);
    }
    const float fresh_sum = p.sum * scale_new;
    st.sum = ggml_mad<Ops>(st.sum, scale_old, fresh_sum);
    st.max = new_max;
  }
  return st;
}

template <class Ops>
void flash_attention_as_llama_cpp_impl(const float* q, int64_t q_stride, int64_t rows,
                                       ValueRows keys, ValueRows values, int64_t n_first, int d,
                                       float scale, LlamaCppFlashAttention how, float* out,
                                       int64_t out_stride) {
  constexpr int lanes = Ops::kGgmlLanes;
  how.f16_keys = how.f16_keys || keys.type == DType::F16;  // F16 rows are read as F16
  how.f16_values = how.f16_values || values.type == DType::F16;
  thread_local std::vector<float> acc;  // [rows, d]: VKQ32 / VKQ16
  thread_local std::vector<FlashSums> sums;
  acc.resize(static_cast<size_t>(rows * d));
  sums.resize(static_cast<size_t>(rows));
  const bool tiled = how.batch_rows >= ggml_order::kFlashTileRows &&
                     how.f16_keys == how.f16_values && (lanes == 0 || d % lanes == 0);
  if (tiled) {
    flash_tiled_rows<Ops>(q, q_stride, rows, keys, values, n_first, d, scale, how, acc.data(),
                          sums.data());
  } else {
    for (int64_t r = 0; r < rows; ++r)
      sums[static_cast<size_t>(r)] = flash_one_row<Ops>(q + r * q_stride, keys, values, n_first + r,
                                                        d, scale, how, acc.data() + r * d);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float sum = sums[static_cast<size_t>(r)].sum;
    const float inverse = sum == 0.0f ? 0.0f : 1.0f / sum;
    const float* a = acc.data() + r * d;
    float* o = out + r * out_stride;
    for (int i = 0; i < d; ++i) o[i] = a[i] * inverse;
  }
}

}  // namespace

namespace PROTOKV_KERNEL_VARIANT {

void flash_attention_as_llama_cpp(const float* q, int64_t q_stride, int64_t rows, ValueRows keys,
                                  ValueRows values, int64_t n_first, int d, float scale,
                                  const LlamaCppFlashAttention& how, float* out,
                                  int64_t out_stride) {
  flash_attention_as_llama_cpp_impl<VariantOps>(q, q_stride, rows, keys, values, n_first, d, scale,
                                                how, out, out_stride);
}

void attention_as_llama_cpp(const float* q, const float* keys, const float* values, int64_t n,
                            int d, float scale, bool batched, float* out) {
  attention_as_llama_cpp_impl<VariantOps>(q, keys, values, n, d, scale, batched, out);
}

void swiglu_as_llama_cpp(float* gate, const float* up, int64_t n) {
  VariantOps::swiglu_as_ggml(gate, up, n);
}

}  // namespace PROTOKV_KERNEL_VARIANT
}  // namespace protokv::kernels
