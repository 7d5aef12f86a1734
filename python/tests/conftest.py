# SPDX-License-Identifier: Apache-2.0
import os
import pathlib
import shutil

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
RECALL_MODEL = REPO / "models" / "protokv-recall.gguf"


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
