"""tierd.native.backends(): its shape, which implementation was selected and why, the forced
pure-Python fallback (in a real subprocess), and in CI: the C extension and the HIP backend
(its compiler is installed there) must have been built."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import tierd.native as native
from tests.unit.native_impls import in_ci

ROWS = ("host", "hip", "cuda", "python")


def test_shape() -> None:
    info = native.backends()
    assert set(info) == set(ROWS)
    for name, row in info.items():
        assert isinstance(row["built"], bool) and isinstance(row["usable"], bool), name
        assert isinstance(row["selected"], bool) and isinstance(row["reason"], str), name
        assert not row["usable"] or row["built"], name
        if not row["usable"]:
            assert row["reason"], f"{name} unusable without a reason"
    assert sum(row["selected"] for row in info.values()) == 1
    selected = next(name for name, row in info.items() if row["selected"])
    assert selected == ("host" if native.IMPLEMENTATION == "c" else "python")
    assert info[selected]["why_selected"]
    for gpu in ("hip", "cuda"):
        assert isinstance(info[gpu]["devices"], int)


def test_c_extension_selected_with_flags() -> None:
    if native.IMPLEMENTATION != "c":
        if in_ci():
            pytest.fail(f"CI must build the C extension: {native.backends()['python']}")
        pytest.skip("C extension not built here")
    host = native.backends()["host"]
    assert host["built"] and host["usable"]
    assert isinstance(host["crc32c_hw"], bool) and host["threads"] >= 1
    assert host["o_direct"] == hasattr(os, "O_DIRECT")


def test_forced_fallback_in_a_subprocess() -> None:
    code = "import json, tierd.native as n; print(json.dumps([n.IMPLEMENTATION, n.backends()]))"
    env = {**os.environ, "WARMGATE_NATIVE": "python"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    impl, info = json.loads(out.stdout)
    assert impl == "python"
    assert info["python"]["selected"] and info["python"]["usable"]
    assert "WARMGATE_NATIVE=python" in info["python"]["why_selected"]
    assert not info["host"]["usable"] and info["host"]["reason"]


def test_gpu_backends_built_where_their_compiler_is() -> None:
    """In CI hipcc is installed, so the HIP backend must be built (and nvcc likewise)."""
    if native.IMPLEMENTATION != "c":
        pytest.skip("no C extension")  # test_c_extension_selected_with_flags fails in CI
    info = native.backends()
    if in_ci() and shutil.which("hipcc"):
        assert info["hip"]["built"], info["hip"]
    if in_ci() and shutil.which("nvcc"):
        assert info["cuda"]["built"], info["cuda"]
    for gpu in ("hip", "cuda"):
        row = info[gpu]
        # a built library loads and resolves the whole ABI (wg_gpu_load says "lacks" / "has
        # ABI" / "cannot load" otherwise); without a device it says so
        assert not row["built"] or not re.search("lacks|has ABI|cannot load", row["reason"]), row
        if row["built"] and not row["usable"]:
            assert row["devices"] == 0 and row["reason"]
        if row["usable"]:
            assert row["devices"] >= 1 and row["device_name"]
