// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which vector instruction sets this translation unit is compiled for (PROTOKV_HAVE_AVX2,
// PROTOKV_HAVE_AVX512), and their intrinsics where any is.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PROTOKV_HAVE_AVX2 1
#endif
#if defined(PROTOKV_HAVE_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__AVX512DQ__)
#define PROTOKV_HAVE_AVX512 1
#endif
#if defined(PROTOKV_HAVE_AVX2) || defined(PROTOKV_HAVE_AVX512)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which -Wuninitialized flags
// once inlined (a false positive: the masks select every lane). Off for the intrinsics' own
// lines only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
