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
# (binaries in bin/). Needs npm, git, cmake, a C++ compiler; about 5-8 minutes on 2 cores.
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

have_all=1
for t in "${TARGETS[@]}"; do [[ -x $BUILD/bin/$t ]] || have_all=0; done
if [[ $have_all == 0 ]]; then
  log "building ${TARGETS[*]} into $BUILD (-j$JOBS)"
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF >/dev/null
  cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >/dev/null
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
