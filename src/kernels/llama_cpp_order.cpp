// SPDX-License-Identifier: Apache-2.0
// llama.cpp's attention arithmetic (kernels/llama_cpp_order.h). Every float operation below is
// one of ggml's, in its order; a product that ggml rounds before adding is its own statement and
// this file is compiled with -ffp-contract=off (CMakeLists.txt: GCC would otherwise fuse across
// statements where FMA is available), and where ggml fuses, std::fma does.
#include "kernels/llama_cpp_order.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "protokv/dtype.h"
#include "protokv/error.h"

namespace protokv::kernels::ggml_order {
namespace {

// The shape of ggml-cpu's F32 loops for one instruction set.
struct GgmlShape {
  int lanes = 0;             // GGML_F32_EPR: floats per vector; 0 = a build without SIMD
  int plain_leftover = 0;    // ggml_vec_dot_f32's leftovers added as rounded products, a multiple
                             // of this many (GCC's vectorised epilogue), before the scalar FMAs
  bool hadd_reduce = false;  // GGML_F32x8_REDUCE ends with two _mm_hadd_ps (AVX2)
};

GgmlShape shape_of(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return {.lanes = 16, .plain_leftover = 8, .hadd_reduce = false};
    case Isa::kAvx2:
      return {.lanes = 8, .plain_leftover = 4, .hadd_reduce = true};
    case Isa::kScalar:
      break;
  }
  return {};
}

// The horizontal sum of one vector of 8 or 16 lanes as ggml takes it in its softmax sums and
// tinyBLAS's hsum (_mm512_reduce_add_ps in GCC's avx512fintrin.h; the AVX2 hsum): upper half plus
// lower half down to four lanes, then (l0 + l2) + (l1 + l3).
float horizontal_sum(const float* lanes, int count) {
  float t[16] = {};
  for (int l = 0; l < count && l < 16; ++l) t[l] = lanes[l];
  for (int width = count / 2; width >= 4; width /= 2)
    for (int l = 0; l < width; ++l) t[l] = t[l + width] + t[l];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// GGML_F32x16_REDUCE / GGML_F32x8_REDUCE of ggml_vec_dot_f32's four accumulators (`acc`, 4 x
// lanes, accumulator-major): (s0 + s2) + (s1 + s3) lane by lane, then the lanes: AVX-512 as
// horizontal_sum, AVX2 as lower + upper half and two _mm_hadd_ps, (t0 + t1) + (t2 + t3).
float vec_dot_reduce(const float* acc, const GgmlShape& shape) {
  const int lanes = shape.lanes;
  float v[16];
  for (int l = 0; l < lanes; ++l)
    v[l] = (acc[l] + acc[2 * lanes + l]) + (acc[lanes + l] + acc[3 * lanes + l]);
  if (!shape.hadd_reduce) return horizontal_sum(v, lanes);
  float t[4];
  for (int l = 0; l < 4; ++l) t[l] = v[l] + v[l + 4];
  return (t[0] + t[1]) + (t[2] + t[3]);
}

constexpr uint32_t bits_of(float x) {
  return std::bit_cast<uint32_t>(x);
}
constexpr float float_of(uint32_t b) {
  return std::bit_cast<float>(b);
}

// One lane of ggml_v_expf, AVX-512 form (ggml-cpu/vec.h; the algorithm of Arm's optimized-routines
// expf): x = n ln2 + b with n = round(x / ln2) by the 1.5 * 2^23 shift, ln 2 in two parts, e^b by
// a degree-5 polynomial in b (Horner in b^2), times 2^n by vscalefps; |n| > 192 gives 0 or inf.
float exp_avx512_lane(float x) {
  constexpr float kShift = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, kShift);
  const float n = z - kShift;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  if (std::isnan(n)) return n;  // vscalefps of a NaN
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : std::numeric_limits<float>::infinity();
  // vscalefps: j * 2^floor(n), correctly rounded (as ldexp); n is a whole number here.
  return std::ldexp(j, static_cast<int>(std::floor(n)));
}

// One lane of ggml_v_expf, AVX2 form: as the AVX-512 one up to the polynomial, whose constant
// term is left out (j = e^b - 1) and whose 2^n is built in the exponent bits of z (k); then
// k + j k, with |n| > 126 taken through two factors s1 s2 so that 2^n may leave the normal range.
float exp_avx2_lane(float x) {
  constexpr float kShift = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, kShift);
  const float n = z - kShift;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const uint32_t e = bits_of(z) << 23;
  const float k = float_of(e + bits_of(1.0f));
  const float u = b * b;
  const float b_term = 0x1.ffffecp-1f * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, b_term);
  if (!(std::fabs(n) > 126.0f)) return std::fma(j, k, k);
  const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = float_of(g + 0x7f000000u);
  const float s2 = float_of(e - g);
  if (std::fabs(n) > 192.0f) return s1 * s1;
  const float scaled = std::fma(s2, j, s2);
  return scaled * s1;
}

// ggml_mul_mat(v^T, p) for one query: out[i] = sum over entries of values[e][i] * p[e], in
// ggml_vec_dot_f32's order (`batched` = false) or tinyBLAS's (true: one accumulator of `lanes`
// lanes, its horizontal sum). Lane accumulators are kept per output value, so that each entry's
// row is read once; the cells llama.cpp pads with have p = 0 and add nothing.
void weighted_values(const GgmlShape& shape, const float* p, const float* values, int64_t n, int d,
                     bool tinyblas, float* out) {
  if (shape.lanes == 0) {  // a build without SIMD: float products summed in double
    thread_local std::vector<double> sums;
    sums.assign(static_cast<size_t>(d), 0.0);
    for (int64_t e = 0; e < n; ++e)
      for (int i = 0; i < d; ++i) {
        const float product = values[e * d + i] * p[e];
        sums[static_cast<size_t>(i)] += static_cast<double>(product);
      }
    for (int i = 0; i < d; ++i) out[i] = static_cast<float>(sums[static_cast<size_t>(i)]);
    return;
  }
  const int slots = tinyblas ? shape.lanes : 4 * shape.lanes;
  thread_local std::vector<float> acc;  // [slots, d]
  acc.assign(static_cast<size_t>(slots) * static_cast<size_t>(d), 0.0f);
  for (int64_t e = 0; e < n; ++e) {
    float* a = acc.data() + (e % slots) * d;
    for (int i = 0; i < d; ++i) a[i] = std::fma(values[e * d + i], p[e], a[i]);
  }
  float lanes[64];
  for (int i = 0; i < d; ++i) {
    for (int s = 0; s < slots; ++s) lanes[s] = acc[static_cast<size_t>(s) * d + i];
    out[i] = tinyblas ? horizontal_sum(lanes, shape.lanes) : vec_dot_reduce(lanes, shape);
  }
}

}  // namespace

float dot_f32(Isa isa, const float* x, const float* y, int64_t n) {
  const GgmlShape shape = shape_of(isa);
  if (shape.lanes == 0) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float product = x[i] * y[i];
      sum += static_cast<double>(product);
    }
    return static_cast<float>(sum);
  }
  const int64_t step = 4 * shape.lanes;
  const int64_t whole = n / step * step;
  float sum = 0.0f;
  if (whole > 0) {
    float acc[64] = {};
    for (int64_t i = 0; i < whole; i += step)
      for (int64_t s = 0; s < step; ++s) acc[s] = std::fma(x[i + s], y[i + s], acc[s]);
    sum = vec_dot_reduce(acc, shape);
  }
  const int64_t plain_end = whole + (n - whole) / shape.plain_leftover * shape.plain_leftover;
  int64_t i = whole;
  for (; i < plain_end; ++i) {
    const float product = x[i] * y[i];
    sum += product;
  }
  for (; i < n; ++i) sum = std::fma(x[i], y[i], sum);
  return sum;
}

float dot_f16(Isa isa, const float* x, const float* y, int64_t n) {
  const int64_t step = 4 * static_cast<int64_t>(shape_of(isa).lanes);
  const int64_t whole = step == 0 ? 0 : n / step * step;
  double sum = whole > 0 ? static_cast<double>(dot_f32(isa, x, y, whole)) : 0.0;
  for (int64_t i = whole; i < n; ++i) {
    const float product = x[i] * y[i];
    sum += static_cast<double>(product);
  }
  return static_cast<float>(sum);
}

float exp(Isa isa, float x) {
  switch (isa) {
    case Isa::kAvx512:
      return exp_avx512_lane(x);
    case Isa::kAvx2:
      return exp_avx2_lane(x);
    case Isa::kScalar:
      break;
  }
  return std::exp(x);
}

void swiglu(Isa isa, float* gate, const float* up, int64_t n) {
  const int lanes = shape_of(isa).lanes;
  const int64_t whole = lanes == 0 ? 0 : n / lanes * lanes;
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    const float e = i < whole ? exp(isa, 0.0f - x) : std::exp(-x);
    const float silu = x / (1.0f + e);
    gate[i] = silu * up[i];
  }
}

void attention(Isa isa, const float* q, const float* keys, const float* values, int64_t n, int d,
               float scale, bool batched, float* out) {
  PROTOKV_CHECK(n > 0 && d > 0, "ggml_order::attention: {} entries of width {}", n, d);
  const GgmlShape shape = shape_of(isa);
  thread_local std::vector<float> p;
  p.resize(static_cast<size_t>(n));
  // ggml_mul_mat(k, q), then ggml_soft_max_ext: ggml_vec_scale_f32 by `scale` (the mask adds 0
  // to every visible cell), ggml_vec_max_f32.
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < n; ++e) {
    const float dot = dot_f32(isa, keys + e * d, q, d);
    p[static_cast<size_t>(e)] = dot * scale;
    max = std::max(max, p[static_cast<size_t>(e)]);
  }
  // ggml_vec_soft_max_f32: a vector of lanes at a time, its horizontal sum added in double.
  double sum = 0.0;
  if (shape.lanes == 0) {
    for (float& value : p) {
      value = std::exp(value - max);
      sum += static_cast<double>(value);
    }
  } else {
    float lanes[16];
    for (int64_t e0 = 0; e0 < n; e0 += shape.lanes) {
      for (int l = 0; l < shape.lanes; ++l) {
        const int64_t e = e0 + l;
        lanes[l] = 0.0f;  // a masked cell: ggml_v_expf(-inf) = 0
        if (e < n) lanes[l] = p[static_cast<size_t>(e)] = exp(isa, p[static_cast<size_t>(e)] - max);
      }
      sum += static_cast<double>(horizontal_sum(lanes, shape.lanes));
    }
  }
  const auto inverse = static_cast<float>(1.0 / sum);
  for (float& value : p) value *= inverse;
  weighted_values(shape, p.data(), values, n, d, batched && d % 4 == 0, out);
}

bool flash_attention_is_tiled(Isa isa, const LlamaCppFlashAttention& how, int d) {
  const int lanes = shape_of(isa).lanes;
  return how.batch_rows >= kFlashTileRows && how.f16_keys == how.f16_values &&
         (lanes == 0 || d % lanes == 0);
}

int64_t flash_attention_split(const LlamaCppFlashAttention& how, int64_t n) {
  const int64_t cells = std::max(
      kFlashCachePadding, (n + kFlashCachePadding - 1) / kFlashCachePadding * kFlashCachePadding);
  if (how.batch_rows != 1 || how.threads <= 1 || cells < kFlashSplitCells ||
      how.f16_keys != how.f16_values)
    return 0;
  return (cells + how.threads - 1) / how.threads;
}

namespace {

// y + x * v as ggml's loops compute it: GCC contracts it into one FMA where the build has them
// (every SIMD build; kScalar is taken as a build for a CPU without FMA).
float ggml_mad(const GgmlShape& shape, float x, float v, float y) {
  if (shape.lanes != 0) return std::fma(x, v, y);
  const float product = x * v;
  return y + product;
}

float to_f16(float x) {
  return f16_to_f32(f32_to_f16(x));
}

// The running state of ggml's online softmax: M, S and the unnormalised output VKQ.
struct FlashState {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;
  std::vector<float> acc;
};

// ggml_compute_forward_flash_attn_ext_f16_one_chunk over entries [0, n).
FlashState one_chunk(Isa isa, const float* q, const float* keys, const float* values, int64_t n,
                     int d, float scale, const LlamaCppFlashAttention& how) {
  const GgmlShape shape = shape_of(isa);
  FlashState st;
  st.acc.assign(static_cast<size_t>(d), 0.0f);  // VKQ32, or VKQ16 for F16 values
  std::vector<float> query(q, q + d);           // converted to the keys' vec_dot type
  if (how.f16_keys)
    for (float& x : query) x = to_f16(x);
  std::vector<float> key(static_cast<size_t>(d)), value(static_cast<size_t>(d));
  for (int64_t e = 0; e < n; ++e) {
    for (int i = 0; i < d; ++i) {  // F16 K/V: what llama.cpp's cast to F16 leaves of F32 rows
      key[static_cast<size_t>(i)] = how.f16_keys ? to_f16(keys[e * d + i]) : keys[e * d + i];
      value[static_cast<size_t>(i)] =
          how.f16_values ? to_f16(values[e * d + i]) : values[e * d + i];
    }
    const float dot = how.f16_keys ? dot_f16(isa, key.data(), query.data(), d)
                                   : dot_f32(isa, key.data(), query.data(), d);
    const float s = dot * scale;
    float rescale = 1.0f;
    float weight = 1.0f;
    if (s > st.max) {
      const float old_max = st.max;
      st.max = s;
      rescale = std::exp(old_max - st.max);
      for (float& a : st.acc) a = how.f16_values ? to_f16(a * rescale) : a * rescale;
    } else {
      weight = std::exp(s - st.max);
    }
    for (int i = 0; i < d; ++i) {
      const float a =
          ggml_mad(shape, value[static_cast<size_t>(i)], weight, st.acc[static_cast<size_t>(i)]);
      st.acc[static_cast<size_t>(i)] = how.f16_values ? to_f16(a) : a;
    }
    st.sum = ggml_mad(shape, st.sum, rescale, weight);
  }
  return st;
}

// ggml_compute_forward_flash_attn_ext_tiled for one query row.
FlashState tiled(Isa isa, const float* q, const float* keys, const float* values, int64_t n, int d,
                 float scale, const LlamaCppFlashAttention& how) {
  // K and V converted to F32 tiles (from F16: what llama.cpp's cast leaves of F32 rows).
  const auto key_at = [&](int64_t e, int i) {
    return how.f16_keys ? to_f16(keys[e * d + i]) : keys[e * d + i];
  };
  const auto value_at = [&](int64_t e, int i) {
    return how.f16_values ? to_f16(values[e * d + i]) : values[e * d + i];
  };
  const GgmlShape shape = shape_of(isa);
  FlashState st;
  st.acc.assign(static_cast<size_t>(d), 0.0f);
  float p[kFlashTileCells];
  for (int64_t t0 = 0; t0 < n; t0 += kFlashTileCells) {
    const int64_t cells = std::min(kFlashTileCells, n - t0);
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < cells; ++j) {
      float dot = 0.0f;  // simd_gemm into a zeroed KQ tile
      for (int i = 0; i < d; ++i) dot = ggml_mad(shape, q[i], key_at(t0 + j, i), dot);
      p[j] = dot * scale;
      tile_max = std::max(tile_max, p[j]);
    }
    const float new_max = std::fmax(st.max, tile_max);
    if (new_max > st.max) {
      const float rescale = std::exp(st.max - new_max);
      for (float& a : st.acc) a *= rescale;
      st.sum *= rescale;
    }
    st.max = new_max;
    // ggml_vec_soft_max_f32 over the 64 cells (the padding's -inf gives 0).
    double tile_sum = 0.0;
    if (shape.lanes == 0) {
      for (int64_t j = 0; j < cells; ++j) {
        p[j] = std::exp(p[j] - st.max);
        tile_sum += static_cast<double>(p[j]);
      }
    } else {
      float lanes[16];
      for (int64_t j0 = 0; j0 < kFlashTileCells; j0 += shape.lanes) {
        for (int l = 0; l < shape.lanes; ++l) {
          const int64_t j = j0 + l;
          lanes[l] = 0.0f;
          if (j < cells) lanes[l] = p[j] = exp(isa, p[j] - st.max);
        }
        tile_sum += static_cast<double>(horizontal_sum(lanes, shape.lanes));
      }
    }
    st.sum = static_cast<float>(static_cast<double>(st.sum) + tile_sum);
    for (int64_t j = 0; j < cells; ++j)
      for (int i = 0; i < d; ++i)
        st.acc[static_cast<size_t>(i)] =
            ggml_mad(shape, value_at(t0 + j, i), p[j], st.acc[static_cast<size_t>(i)]);
  }
  return st;
}

}  // namespace

void flash_attention(Isa isa, const float* q, const float* keys, const float* values, int64_t n,
                     int d, float scale, const LlamaCppFlashAttention& how, float* out) {
  PROTOKV_CHECK(n > 0 && d > 0, "ggml_order::flash_attention: {} entries of width {}", n, d);
  const GgmlShape shape = shape_of(isa);
  FlashState st;
  if (flash_attention_is_tiled(isa, how, d)) {
    st = tiled(isa, q, keys, values, n, d, scale, how);
  } else if (const int64_t chunk = flash_attention_split(how, n); chunk > 0) {
    // ggml_flash_attn_ext_reduce_partials: each thread's chunk of cells (the padded ones masked)
    // as one chunk, merged in thread order; GCC fuses the first product of each merge (where
    // the build has FMA).
    st.acc.assign(static_cast<size_t>(d), 0.0f);
    for (int64_t first = 0; first < n; first += chunk) {
      const FlashState part = one_chunk(isa, q, keys + first * d, values + first * d,
                                        std::min(chunk, n - first), d, scale, how);
      if (part.sum == 0.0f) continue;
      const float new_max = std::fmax(st.max, part.max);
      const float scale_old = std::exp(st.max - new_max);
      const float scale_new = std::exp(part.max - new_max);
      for (int i = 0; i < d; ++i) {
        const float fresh = part.acc[static_cast<size_t>(i)] * scale_new;
        st.acc[static_cast<size_t>(i)] =
            ggml_mad(shape, st.acc[static_cast<size_t>(i)], scale_old, fresh);
      }
      const float fresh_sum = part.sum * scale_new;
      st.sum = ggml_mad(shape, st.sum, scale_old, fresh_sum);
      st.max = new_max;
    }
  } else {
    st = one_chunk(isa, q, keys, values, n, d, scale, how);
  }
  const float inverse = st.sum == 0.0f ? 0.0f : 1.0f / st.sum;
  for (int i = 0; i < d; ++i) out[i] = st.acc[static_cast<size_t>(i)] * inverse;
}

}  // namespace protokv::kernels::ggml_order
