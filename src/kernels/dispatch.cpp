// SPDX-License-Identifier: Apache-2.0
// Run-time choice of the kernel variant (kernels/isa.h, kernels/variant.h) and the public kernels
// that forward to it. Compiled for the baseline CPU (no -march): this file must run anywhere.
#include <cstdlib>
#include <string>
#include <vector>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels/clustering.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/variant.h"
#include "protokv/error.h"

namespace protokv::kernels {

// The tables of the variants this build has (CMakeLists.txt defines PROTOKV_KERNELS_<variant>).
namespace scalar {
const KernelVariant& kernel_table();
}
#if defined(PROTOKV_KERNELS_avx2)
namespace avx2 {
const KernelVariant& kernel_table();
}
#endif
#if defined(PROTOKV_KERNELS_avx512)
namespace avx512 {
const KernelVariant& kernel_table();
}
#endif

namespace {

// Each variant's name (PROTOKV_ISA's values) and what it needs of the CPU, in Isa order.
struct IsaFacts {
  Isa isa;
  std::string_view name;
  std::string_view requirements;
};
constexpr IsaFacts kIsaFacts[] = {
    {Isa::kScalar, "scalar", "nothing beyond the baseline"},
    {Isa::kAvx2, "avx2", "AVX2, FMA and F16C"},
    {Isa::kAvx512, "avx512", "AVX2, FMA, F16C and AVX-512 F, BW, VL, DQ and VNNI"},
};

static_assert(kIsaFacts[static_cast<size_t>(Isa::kScalar)].isa == Isa::kScalar &&
              kIsaFacts[static_cast<size_t>(Isa::kAvx2)].isa == Isa::kAvx2 &&
              kIsaFacts[static_cast<size_t>(Isa::kAvx512)].isa == Isa::kAvx512);

const IsaFacts& facts(Isa isa) {
  return kIsaFacts[static_cast<size_t>(isa)];
}

// The variant's table, or nullptr when this build lacks it.
const KernelVariant* built_table(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return &scalar::kernel_table();
    case Isa::kAvx2:
#if defined(PROTOKV_KERNELS_avx2)
      return &avx2::kernel_table();
#else
      return nullptr;
#endif
    case Isa::kAvx512:
#if defined(PROTOKV_KERNELS_avx512)
      return &avx512::kernel_table();
#else
      return nullptr;
#endif
  }
  return nullptr;
}

// Whether this CPU (and its operating system, which must save the wider registers: libgcc's
// checks include XGETBV) runs the variant's instructions: the flags CMakeLists.txt compiles it
// with.
bool cpu_runs(Isa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29) directly: clang before 15 has no "f16c" for
  // __builtin_cpu_supports, and the fuzz build (fuzz/) uses Debian's clang 14.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return avx2;
    case Isa::kAvx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return isa == Isa::kScalar;
#endif
}

const KernelVariant& table(Isa isa) {
  const KernelVariant* found = built_table(isa);
  if (found == nullptr) fail("kernels: this build has no {} variant", isa_name(isa));
  return *found;
}

const KernelVariant& active() {
  static const KernelVariant& chosen = table(active_isa());
  return chosen;
}

}  // namespace

std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
  for (const IsaFacts& variant : kIsaFacts)
    if (built_table(variant.isa) != nullptr && cpu_runs(variant.isa)) isas.push_back(variant.isa);
  return isas;
}

Isa active_isa() {
  static const Isa isa = [] {
    const std::vector<Isa> available = available_isas();
    const char* requested = std::getenv("PROTOKV_ISA");
    if (requested == nullptr || *requested == '\0') return available.back();
    std::string names;
    for (const IsaFacts& variant : kIsaFacts) {
      const Isa candidate = variant.isa;
      if (variant.name != requested) continue;
      if (built_table(candidate) == nullptr)
        fail("PROTOKV_ISA={}: this build has no such kernel variant", requested);
      if (!cpu_runs(candidate))
        fail("PROTOKV_ISA={}: this CPU cannot run it (it needs {})", requested,
             isa_requirements(candidate));
      return candidate;
    }
    for (Isa candidate : available)
      names += (names.empty() ? "" : ", ") + std::string(isa_name(candidate));
    fail("PROTOKV_ISA={}: not a kernel variant (this CPU runs: {})", requested, names);
  }();
  return isa;
}

std::string_view isa_name(Isa isa) {
  return facts(isa).name;
}

std::string_view isa_requirements(Isa isa) {
  return facts(isa).requirements;
}

float dot(Isa isa, const float* a, const float* b, int64_t n) {
  return table(isa).dot(a, b, n);
}
float dot(const float* a, const float* b, int64_t n) {
  return active().dot(a, b, n);
}

void rmsnorm(Isa isa, float* out, const float* x, const float* weight, int64_t n, float eps) {
  table(isa).rmsnorm(out, x, weight, n, eps);
}
void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps) {
  active().rmsnorm(out, x, weight, n, eps);
}

void softmax(Isa isa, float* x, int64_t n) {
  table(isa).softmax(x, n);
}
void softmax(float* x, int64_t n) {
  active().softmax(x, n);
}

float vector_exp(Isa isa, float x) {
  return table(isa).exp(x);
}

void matvec(Isa isa, const WeightMatrix& w, const float* x, float* y) {
  table(isa).matvec_rows(w, x, 1, y);
}
void matvec(const WeightMatrix& w, const float* x, float* y) {
  active().matvec_rows(w, x, 1, y);
}
void matvec_rows(Isa isa, const WeightMatrix& w, const float* x, int64_t n, float* y) {
  table(isa).matvec_rows(w, x, n, y);
}
void matvec_rows(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  active().matvec_rows(w, x, n, y);
}
void matmul_as_llama_cpp(Isa isa, const WeightMatrix& w, const float* x, int64_t n, float* y,
                         bool batched) {
  table(isa).matmul_as_llama_cpp(w, x, n, y, batched);
}
void matmul_as_llama_cpp(const WeightMatrix& w, const float* x, int64_t n, float* y, bool batched) {
  active().matmul_as_llama_cpp(w, x, n, y, batched);
}
void attention_as_llama_cpp(Isa isa, const float* q, const float* keys, const float* values,
                            int64_t n, int d, float scale, bool batched, float* out) {
  table(isa).attention_as_llama_cpp(q, keys, values, n, d, scale, batched, out);
}
void attention_as_llama_cpp(const float* q, const float* keys, const float* values, int64_t n,
                            int d, float scale, bool batched, float* out) {
  active().attention_as_llama_cpp(q, keys, values, n, d, scale, batched, out);
}
void flash_attention_as_llama_cpp(Isa isa, const float* q, ValueRows keys, ValueRows values,
                                  int64_t n, int d, float scale, const LlamaCppFlashAttention& how,
                                  float* out) {
  table(isa).flash_attention_as_llama_cpp(q, d, 1, keys, values, n, d, scale, how, out, d);
}
void flash_attention_as_llama_cpp(const float* q, ValueRows keys, ValueRows values, int64_t n,
                                  int d, float scale, const LlamaCppFlashAttention& how,
                                  float* out) {
  active().flash_attention_as_llama_cpp(q, d, 1, keys, values, n, d, scale, how, out, d);
}
void flash_attention_as_llama_cpp(Isa isa, const float* q, int64_t q_stride, int64_t rows,
                                  ValueRows keys, ValueRows values, int64_t n_first, int d,
                                  float scale, const LlamaCppFlashAttention& how, float* out,
                                  int64_t out_stride) {
  table(isa).flash_attention_as_llama_cpp(q, q_stride, rows, keys, values, n_first, d, scale, how,
                                          out, out_stride);
}
void flash_attention_as_llama_cpp(const float* q, int64_t q_stride, int64_t rows, ValueRows keys,
                                  ValueRows values, int64_t n_first, int d, float scale,
                                  const LlamaCppFlashAttention& how, float* out,
                                  int64_t out_stride) {
  active().flash_attention_as_llama_cpp(q, q_stride, rows, keys, values, n_first, d, scale, how,
                                        out, out_stride);
}
void swiglu_as_llama_cpp(Isa isa, float* gate, const float* up, int64_t n) {
  table(isa).swiglu_as_llama_cpp(gate, up, n);
}
void swiglu_as_llama_cpp(float* gate, const float* up, int64_t n) {
  active().swiglu_as_llama_cpp(gate, up, n);
}

float legacy_quant_dot(Isa isa, DType type, const void* row, const QuantizedActivation& x,
                       int64_t cols) {
  return table(isa).legacy_quant_dot(type, row, x, cols);
}

void weight_row_to_f32(Isa isa, DType type, const void* row, float* out, int64_t n) {
  table(isa).weight_row_to_f32(type, row, out, n);
}

void matmul(Isa isa, const WeightMatrix& w, const float* x, int64_t n, float* y) {
  table(isa).matmul(w, x, n, y);
}
void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  active().matmul(w, x, n, y);
}

void attention_prefill_heads(Isa isa, HeadsView q, HeadsView k, HeadsView v, MutableHeadsView out,
                             int64_t n_queries, int64_t n_past, int n_heads, int n_kv_heads,
                             int head_dim, int64_t window) {
  table(isa).attention_prefill_heads(q, k, v, out, n_queries, n_past, n_heads, n_kv_heads, head_dim,
                                     window);
}
void attention_prefill_heads(HeadsView q, HeadsView k, HeadsView v, MutableHeadsView out,
                             int64_t n_queries, int64_t n_past, int n_heads, int n_kv_heads,
                             int head_dim, int64_t window) {
  active().attention_prefill_heads(q, k, v, out, n_queries, n_past, n_heads, n_kv_heads, head_dim,
                                   window);
}

void attention_prefill_cached(HeadsView q, std::span<const KvHeadRows> kv_heads,
                              MutableHeadsView out, int64_t n_queries, int n_heads, int head_dim) {
  active().attention_prefill_cached(q, kv_heads, out, n_queries, n_heads, head_dim);
}

void attention_prefill(const float* q, const float* k, const float* v, int64_t n, int d,
                       float* out) {
  active().attention_prefill(q, k, v, n, d, out);
}

namespace {

int64_t segment_entries(std::span<const KeySegment> segments) {
  int64_t n = 0;
  for (const KeySegment& segment : segments) n += segment.count;
  return n;
}

// The dense and gathered decode kernels as one segment of keys, for a given variant: the
// overloads without an Isa (decode's hot path, once per KV head and layer) pass active() and
// skip table()'s lookup.
void decode_group(const KernelVariant& variant, const float* q, int group, const float* keys,
                  const float* values, const float* log_weights, int64_t n, int d, float* out,
                  float* probs) {
  const KeySegment all{keys, n, nullptr};
  variant.attention_decode_group_segments(q, group, {&all, 1}, values, log_weights, n, d, out,
                                          probs);
}

void decode_gathered(const KernelVariant& variant, const float* q, const float* keys,
                     const float* values, const float* log_weights,
                     std::span<const int32_t> indices, int d, float* out, float* probs) {
  const KeySegment all{keys, int64_t{1} << 62, nullptr};  // as long as any cache: row r at r * d
  variant.attention_decode_gathered_segments(q, {&all, 1}, values, log_weights, indices, d, out,
                                             probs);
}

}  // namespace

void attention_decode_group(Isa isa, const float* q, int group, const float* keys,
                            const float* values, const float* log_weights, int64_t n, int d,
                            float* out, float* probs) {
  decode_group(table(isa), q, group, keys, values, log_weights, n, d, out, probs);
}
void attention_decode_group(const float* q, int group, const float* keys, const float* values,
                            const float* log_weights, int64_t n, int d, float* out, float* probs) {
  decode_group(active(), q, group, keys, values, log_weights, n, d, out, probs);
}
void attention_decode(const float* q, const float* keys, const float* values,
                      const float* log_weights, int64_t n, int d, float* out, float* probs) {
  decode_group(active(), q, 1, keys, values, log_weights, n, d, out, probs);
}

void attention_decode_group_segments(Isa isa, const float* q, int group,
                                     std::span<const KeySegment> keys, ValueRows values,
                                     const float* log_weights, int d, float* out, float* probs) {
  table(isa).attention_decode_group_segments(q, group, keys, values, log_weights,
                                             segment_entries(keys), d, out, probs);
}
void attention_decode_group_segments(const float* q, int group, std::span<const KeySegment> keys,
                                     ValueRows values, const float* log_weights, int d, float* out,
                                     float* probs) {
  active().attention_decode_group_segments(q, group, keys, values, log_weights,
                                           segment_entries(keys), d, out, probs);
}

void attention_decode_gathered(Isa isa, const float* q, const float* keys, const float* values,
                               const float* log_weights, std::span<const int32_t> indices, int d,
                               float* out, float* probs) {
  decode_gathered(table(isa), q, keys, values, log_weights, indices, d, out, probs);
}
void attention_decode_gathered(const float* q, const float* keys, const float* values,
                               const float* log_weights, std::span<const int32_t> indices, int d,
                               float* out, float* probs) {
  decode_gathered(active(), q, keys, values, log_weights, indices, d, out, probs);
}

void attention_decode_gathered_segments(Isa isa, const float* q, std::span<const KeySegment> keys,
                                        ValueRows values, const float* log_weights,
                                        std::span<const int32_t> indices, int d, float* out,
                                        float* probs) {
  table(isa).attention_decode_gathered_segments(q, keys, values, log_weights, indices, d, out,
                                                probs);
}
void attention_decode_gathered_segments(const float* q, std::span<const KeySegment> keys,
                                        ValueRows values, const float* log_weights,
                                        std::span<const int32_t> indices, int d, float* out,
                                        float* probs) {
  active().attention_decode_gathered_segments(q, keys, values, log_weights, indices, d, out, probs);
}

void chunk_pass_range(Isa isa, const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                      int64_t m_end, float* norms, float* chunk_sums, float* delta,
                      const LocalDots& local) {
  table(isa).chunk_pass_range(keys, n, d, k, m_begin, m_end, norms, chunk_sums, delta, local);
}
void chunk_pass_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                      int64_t m_end, float* norms, float* chunk_sums, float* delta,
                      const LocalDots& local) {
  active().chunk_pass_range(keys, n, d, k, m_begin, m_end, norms, chunk_sums, delta, local);
}

void rows_dot(const float* rows, int64_t begin, int64_t end, int d, const float* vec, float* out) {
  active().rows_dot(rows, begin, end, d, vec, out);
}

void assign_to_prototypes(Isa isa, const float* keys, int64_t n, int d, const float* prototypes,
                          int count, int32_t* out) {
  table(isa).assign_to_prototypes(keys, n, d, prototypes, count, out);
}
void assign_to_prototypes(const float* keys, int64_t n, int d, const float* prototypes, int count,
                          int32_t* out) {
  active().assign_to_prototypes(keys, n, d, prototypes, count, out);
}

}  // namespace protokv::kernels
