#pragma once
// Instruction-set variants of the kernels. The public functions in kernels.h use the best set
// compiled in (-march=native); tests and benchmarks call each compiled variant explicitly
// through the Isa overloads below, so the portable scalar path is always exercised too.
#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/simd.h"

namespace protokv::kernels {

enum class Isa { kScalar, kAvx2, kAvx512 };

inline constexpr Isa kBestIsa =
#if defined(PROTOKV_HAVE_AVX512)
    Isa::kAvx512;
#elif defined(PROTOKV_HAVE_AVX2)
    Isa::kAvx2;
#else
    Isa::kScalar;
#endif

// Every variant built into this binary, scalar first.
std::vector<Isa> compiled_isas();
// The variant the kernels without an Isa argument (kernels.h) run: the best one compiled in, or
// the one the environment variable PROTOKV_ISA names (scalar | avx2 | avx512), so that every
// compiled path can be run end to end on one machine. Read once. Throws Error when PROTOKV_ISA
// names no compiled variant: load_model(), Session and PrefilledPrompt call it first, so the error
// surfaces there and never inside a parallel region.
Isa active_isa();
std::string_view isa_name(Isa isa);

// Calls f(Ops{}) with the primitive struct of `isa` (scalar when `isa` was not compiled in).
template <class F>
decltype(auto) with_isa(Isa isa, F&& f) {
  switch (isa) {
#if defined(PROTOKV_HAVE_AVX512)
    case Isa::kAvx512:
      return f(Avx512Ops{});
#endif
#if defined(PROTOKV_HAVE_AVX2)
    case Isa::kAvx2:
      return f(Avx2Ops{});
#endif
    default:
      return f(ScalarOps{});
  }
}

// Same contracts as the functions of the same names in kernels.h.
float dot(Isa isa, const float* a, const float* b, int64_t n);
void rmsnorm(Isa isa, float* out, const float* x, const float* weight, int64_t n, float eps);
void softmax(Isa isa, float* x, int64_t n);
void matvec(Isa isa, const WeightMatrix& w, const float* x, float* y);
void matmul(Isa isa, const WeightMatrix& w, const float* x, int64_t n, float* y);
void attention_prefill_heads(Isa isa, HeadsView q, HeadsView k, HeadsView v, MutableHeadsView out,
                             int64_t n_queries, int64_t n_past, int n_heads, int n_kv_heads,
                             int head_dim, int64_t window = 0);
void attention_decode_group(Isa isa, const float* q, int group, const float* keys,
                            const float* values, const float* log_weights, int64_t n, int d,
                            float* out, float* probs);
void attention_decode_gathered(Isa isa, const float* q, const float* keys, const float* values,
                               const float* log_weights, std::span<const int32_t> indices, int d,
                               float* out, float* probs);
void attention_decode_gathered_segments(Isa isa, const float* q, std::span<const KeySegment> keys,
                                        const float* values, const float* log_weights,
                                        std::span<const int32_t> indices, int d, float* out,
                                        float* probs);
void attention_decode_group_segments(Isa isa, const float* q, int group,
                                     std::span<const KeySegment> keys, const float* values,
                                     const float* log_weights, int d, float* out, float* probs);

}  // namespace protokv::kernels
