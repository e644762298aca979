"""One-command check of tierd's GPU backend on a machine with a device:

    python3 -m tierd.native.device_check --build [--backend cuda] [--json OUT]

`--build` compiles the C extension (cc, Python headers) and the backend library (nvcc or
hipcc) straight into tierd/native/ with nothing but the standard library (no pip, no network).
Then, through `tierd.native`: a DeviceArena, pinned HostArenas, and `copy_batch` of N slices
(default 4,096 x 256 KiB = 1 GiB) host->device, device->host and device->device, each
timed (best of --repeat) and verified by CRC-32C of what came back. Pageable (unpinned) H2D
is measured too. If the extension cannot be built, the backend library is still exercised
directly through ctypes (device count, malloc, batched copies). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tierd.native.errors import DeviceCopyError

HERE = Path(__file__).resolve().parent
# every C file of the module (the GPU backend is the .cu, built apart)
C_SOURCES = sorted(p.name for p in HERE.glob("*.c"))


def _compiler(name: str, env_var: str, extra: Sequence[str]) -> str | None:
    for cand in (os.environ.get(env_var), shutil.which(name), *extra):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def build(backend: str) -> dict[str, str]:
    """Compile the extension and the backend library in place; returns what happened."""
    out: dict[str, str] = {}
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    ext = HERE / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = [cc, "-O2", "-std=gnu11", "-fPIC", "-shared", f"-I{sysconfig.get_paths()['include']}"]
    cmd += [str(HERE / s) for s in C_SOURCES] + ["-o", str(ext), "-ldl", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out["extension"] = "built" if proc.returncode == 0 else proc.stderr[-2000:]
    lib = HERE / f"_wg_{backend}.so"
    src = str(HERE / "gpu_backend.cu")
    if backend == "cuda":
        nvcc = _compiler("nvcc", "NVCC", ["/usr/local/cuda/bin/nvcc"])
        gcmd = [nvcc or "nvcc", "-O2", "-Xcompiler", "-fPIC", "-shared", "-I", str(HERE)]
        gcmd += ["-x", "cu", src, "-o", str(lib)]
        env = dict(os.environ)
    else:
        hipcc = _compiler("hipcc", "HIPCC", ["/opt/rocm/bin/hipcc"])
        arch = os.environ.get("WARMGATE_HIP_ARCH", "gfx942")
        gcmd = [hipcc or "hipcc", "-O2", "-fPIC", "-shared", "-DWG_HIP", f"--offload-arch={arch}"]
        gcmd += ["-I", str(HERE), "-x", "hip", src, "-o", str(lib)]
        env = {**os.environ, "HIP_PLATFORM": "amd"}
    try:
        proc = subprocess.run(gcmd, capture_output=True, text=True, check=False, env=env)
        out[backend] = "built" if proc.returncode == 0 else proc.stderr[-2000:]
    except FileNotFoundError as exc:
        out[backend] = f"compiler not found: {exc}"
    return out


def _best(repeat: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def check_extension(backend: str, slices: int, slice_bytes: int, repeat: int) -> dict[str, Any]:
    """copy_batch H2D / D2H / D2D through tierd.native, timed and verified."""
    import tierd.native as native

    total = slices * slice_bytes
    offs = [i * slice_bytes for i in range(slices)]
    rev = list(reversed(offs))
    sizes = [slice_bytes] * slices
    report: dict[str, Any] = {
        "backends": native.backends(),
        "implementation": native.IMPLEMENTATION,
    }
    src = native.HostArena(total, pinned=True)
    back = native.HostArena(total, pinned=True)
    pageable = native.HostArena(total)
    dev = native.DeviceArena(2 * total, backend)
    try:
        memoryview(src)[:] = os.urandom(total)
        memoryview(back)[:] = bytes(total)
        memoryview(pageable)[:] = bytes(total)
        want = native.crc32c_batch(src, offs, sizes)
        h2d = _best(repeat, lambda: native.copy_batch(dev, offs, src, rev, sizes))
        batch_api = dev.batch_api
        h2d_pageable = _best(repeat, lambda: native.copy_batch(dev, rev, pageable, offs, sizes))
        native.copy_batch(dev, offs, src, rev, sizes)  # the real data again
        d2d = _best(
            repeat, lambda: native.copy_batch(dev, [total + o for o in offs], dev, offs, sizes)
        )
        d2h = _best(
            repeat, lambda: native.copy_batch(back, rev, dev, [total + o for o in offs], sizes)
        )
        intact = native.crc32c_batch(back, offs, sizes) == want
        report.update(
            {
                "pinned": src.pinned,
                "h2d_gbps": total / h2d / 1e9,
                "h2d_pageable_gbps": total / h2d_pageable / 1e9,
                "d2h_gbps": total / d2h / 1e9,
                "d2d_gbps": 2 * total / d2d / 1e9,  # read + write
                "d2d_copy_gbps": total / d2d / 1e9,
                "batch_api": batch_api,
                "round_trip_intact": intact,
            }
        )
    finally:
        dev.close()
        for arena in (src, back, pageable):
            arena.close()
    return report


def check_library(backend: str, slices: int, slice_bytes: int, repeat: int) -> dict[str, Any]:
    """The backend library alone, through ctypes (when the extension cannot be built)."""
    lib = ctypes.CDLL(str(HERE / f"_wg_{backend}.so"))
    err = ctypes.create_string_buffer(512)
    n = lib.wg_gpu_device_count(err, 512)
    if n <= 0:
        return {"devices": n, "error": err.value.decode()}
    ctx = ctypes.c_void_p()
    dptr = ctypes.c_void_p()
    total = slices * slice_bytes
    if lib.wg_gpu_open(0, 4, ctypes.byref(ctx), err, 512) or lib.wg_gpu_malloc(
        ctx, ctypes.c_size_t(total), ctypes.byref(dptr), err, 512
    ):
        return {"devices": n, "error": err.value.decode()}
    host = (ctypes.c_char * total).from_buffer(bytearray(os.urandom(total)))
    hbase, dbase = ctypes.addressof(host), dptr.value or 0
    ptrs = ctypes.c_void_p * slices
    dsts = ptrs(*[dbase + i * slice_bytes for i in range(slices)])
    srcs = ptrs(*[hbase + i * slice_bytes for i in range(slices)])
    szs = (ctypes.c_size_t * slices)(*([slice_bytes] * slices))
    used = ctypes.c_int()

    def copy(d: Any, s: Any) -> None:
        if lib.wg_gpu_copy_batch(
            ctx, d, s, szs, ctypes.c_size_t(slices), ctypes.byref(used), err, 512
        ):
            raise DeviceCopyError(err.value.decode())

    h2d = _best(repeat, lambda: copy(dsts, srcs))
    d2h = _best(repeat, lambda: copy(srcs, dsts))
    lib.wg_gpu_free(ctx, dptr)
    lib.wg_gpu_close(ctx)
    return {
        "devices": n,
        "h2d_pageable_gbps": total / h2d / 1e9,
        "d2h_pageable_gbps": total / d2h / 1e9,
        "batch_api": bool(used.value),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tierd.native.device_check")
    p.add_argument("--build", action="store_true", help="compile the extension and backend first")
    p.add_argument("--backend", choices=["cuda", "hip"], default="cuda")
    p.add_argument("--slices", type=int, default=4096)
    p.add_argument("--slice-bytes", type=int, default=256 * 1024)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    report: dict[str, Any] = {"backend": args.backend, "slices": args.slices}
    report["slice_bytes"] = args.slice_bytes
    if args.build:
        # This process imported tierd.native before the build: check in a fresh one.
        report["build"] = build(args.backend)
        rest = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--build"]
        proc = subprocess.run(
            [sys.executable, "-m", "tierd.native.device_check", *rest],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            report.update(json.loads(proc.stdout))
        except json.JSONDecodeError:
            report["check_error"] = (proc.stdout + proc.stderr)[-4000:]
        return _finish(report, args.json)
    try:
        report.update(check_extension(args.backend, args.slices, args.slice_bytes, args.repeat))
    except Exception as exc:  # report it, then try the library alone
        report["extension_error"] = f"{type(exc).__name__}: {exc}"
        try:
            report["library"] = check_library(
                args.backend, args.slices, args.slice_bytes, args.repeat
            )
        except Exception as lib_exc:
            report["library_error"] = f"{type(lib_exc).__name__}: {lib_exc}"
    return _finish(report, args.json)


def _finish(report: dict[str, Any], out: Path | None) -> int:
    text = json.dumps(report, indent=2, default=str)
    if out:
        out.write_text(text + "\n")
    print(text)
    return 0 if report.get("round_trip_intact") is True else 1


if __name__ == "__main__":
    sys.exit(main())
