#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds llama.cpp (CPU, Release) from the source that the npm package node-llama-cpp ships as a
# git bundle (package/llama/gitRelease.bundle; llama.cpp upstream de3ff81, MIT), plus
# protokv-dump-logits (tools/llama_cpp/dump_logits.cpp) and protokv-llama-oracle
# (tools/llama_cpp/llama_oracle.cpp) linked against it. Not part of CI: it is the oracle for
# tools/llama_cpp/make_fixtures.sh, make_real_model_fixtures.sh, bench/vs_llama_cpp.sh and
# bench/serve.sh (llama-server).
#
#   tools/llama_cpp/build.sh            # prints the build folder; skips what is already built
#
# Cache: ${PROTOKV_CACHE:-$HOME/.cache/protokv}/llama.cpp-src (clone) and llama.cpp-build
# (binaries in bin/). Needs npm, git, cmake, a C++ compiler that knows -mno-avx512fp16 (GCC 12,
# clang 14 or later); about 5-8 minutes on 2 cores.
set -euo pipefail

NODE_LLAMA_CPP_VERSION=${NODE_LLAMA_CPP_VERSION:-3.22}
CACHE=${PROTOKV_CACHE:-$HOME/.cache/protokv}
SRC=$CACHE/llama.cpp-src
BUILD=$CACHE/llama.cpp-build
JOBS=${JOBS:-2}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TARGETS=(llama-perplexity llama-quantize llama-bench llama-simple llama-completion llama-tokenize
  llama-server)

log() { echo "llama_cpp/build.sh: $*" >&2; }

mkdir -p "$CACHE"
if [[ ! -f $SRC/CMakeLists.txt ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  log "fetching node-llama-cpp@$NODE_LLAMA_CPP_VERSION with npm pack"
  (cd "$tmp" && npm pack --silent "node-llama-cpp@$NODE_LLAMA_CPP_VERSION" >/dev/null)
  tar -xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" package/llama/gitRelease.bundle
  rm -rf "$SRC"
  git -c advice.detachedHead=false clone --quiet "$tmp/package/llama/gitRelease.bundle" "$SRC"
  log "llama.cpp source at $SRC ($(git -C "$SRC" log -1 --format=%h))"
fi

# -march=native without AMX: ggml's AMX kernels died with SIGILL at their first `tilezero` on a
# KVM guest whose CPU reports amx_tile and amx_int8 (Xeon, family 6 model 207, 2026-11-27), in
# llama-bench and llama-perplexity alike. Without AVX512-FP16 too: with it (Sapphire Rapids and
# later) ggml_vec_dot_f16 accumulates F16 dot products in FP16 arithmetic (GGML_F16_STEP 128,
# _mm512_fmadd_ph), 2e-3 relative on a row of 128, where every other x86 build, and protokv,
# accumulates in F32; the oracle is that common arithmetic. A change of these flags rebuilds (the
# stamp file).
NATIVE_EXCEPT="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -mno-avx512fp16"
CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
  "-DCMAKE_C_FLAGS=$NATIVE_EXCEPT" "-DCMAKE_CXX_FLAGS=$NATIVE_EXCEPT")
have_all=1
for t in "${TARGETS[@]}"; do [[ -x $BUILD/bin/$t ]] || have_all=0; done
[[ "$(cat "$BUILD/protokv-cmake-flags" 2>/dev/null)" == "${CMAKE_FLAGS[*]}" ]] || have_all=0
if [[ $have_all == 0 ]]; then
  log "building ${TARGETS[*]} into $BUILD (-j$JOBS)"
  cmake -S "$SRC" -B "$BUILD" "${CMAKE_FLAGS[@]}" >/dev/null
  cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >/dev/null
  echo "${CMAKE_FLAGS[*]}" >"$BUILD/protokv-cmake-flags"
  rm -f "$BUILD"/bin/protokv-dump-logits "$BUILD"/bin/protokv-llama-oracle  # relinked below
fi

# Our own small programs against the llama.cpp libraries: protokv-dump-logits (teacher-forced
# logits, tools/llama_cpp/dump_logits.cpp) and protokv-llama-oracle (greedy continuations and chat
# templates, tools/llama_cpp/llama_oracle.cpp; it reads JSON with llama.cpp's vendored nlohmann).
for tool in dump_logits:protokv-dump-logits llama_oracle:protokv-llama-oracle; do
  src=$HERE/${tool%%:*}.cpp exe=$BUILD/bin/${tool#*:}
  if [[ ! -x $exe || $src -nt $exe ]]; then
    log "building $exe"
    # Static libraries in link order: llama, then ggml (backend registry), its CPU backend, its base.
    ${CXX:-c++} -O2 -std=c++17 "$src" -I"$SRC/include" -I"$SRC/ggml/include" -I"$SRC/vendor" \
      "$BUILD/src/libllama.a" "$BUILD/ggml/src/libggml.a" "$BUILD/ggml/src/libggml-cpu.a" \
      "$BUILD/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -o "$exe"
  fi
done
echo "$BUILD"
