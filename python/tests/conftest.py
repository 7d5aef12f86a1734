# SPDX-License-Identifier: Apache-2.0
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
RECALL_MODEL = REPO / "models" / "protokv-recall.gguf"

# The OpenBLAS kernels the CLI relaunches itself with (src/kernels/blas_core.h), for this process
# too, before it loads OpenBLAS (which reads OPENBLAS_CORETYPE only then): the package's logits
# are compared bit for bit with the CLI's, which inherits the variable.
if not os.environ.get("OPENBLAS_CORETYPE"):
    _better = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", "import protokv; print(protokv._core.blas_core()[1])"],
        capture_output=True, text=True, check=False).stdout.strip()
    if _better:
        os.environ["OPENBLAS_CORETYPE"] = _better


@pytest.fixture(scope="session")
def recall_path() -> str:
    return str(RECALL_MODEL)


@pytest.fixture(scope="session")
def recall(recall_path):
    import protokv

    return protokv.Model(recall_path, n_threads=2)


@pytest.fixture(scope="session")
def protokv_cli() -> str:
    """The CLI built beside the module (PROTOKV_BINARY, else build/protokv): the reference the
    package must agree with. Under CI a missing binary fails instead of skipping."""
    path = os.environ.get("PROTOKV_BINARY") or str(REPO / "build" / "protokv")
    if not os.access(path, os.X_OK):
        path = shutil.which("protokv") or path
    if not os.access(path, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"protokv CLI not found at {path} (set PROTOKV_BINARY)")
        pytest.skip("protokv CLI not built")
    return path
