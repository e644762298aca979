"""`tierd bench --json OUT`: copy, file-read and checksum speed of the native module,
measured in one run on the same data.

Figures (GB/s = 1e9 bytes/s, best of `--repeat` runs):
- ``host_copy_gbps``: one `copy_batch` of N slices (default 4,096 × 256 KiB) between two
  host arenas (the memcpy thread pool); ``memcpy_baseline_gbps``: one thread, one plain
  memcpy of the same bytes (`memcpy_single`).
- ``file_read_gbps``: one `read_batch` of the N slice files from the array directory,
  in parallel, O_DIRECT where the filesystem allows it (`probe_direct`);
  ``file_read_baseline_gbps``: one thread reading the same files one after another, buffered
  (`read_batch(threads=1)`: open, pread from offset 0 (a plain read), close, in C, so the
  baseline pays no Python overhead). ``file_read_buffered_parallel_gbps``: the parallel
  read without O_DIRECT, to separate the two effects. The page cache is dropped before every
  read run (fdatasync + posix_fadvise(DONTNEED) per file, `drop_page_cache`), so each run
  reads from the device. ``parallel_read_speedup`` = file_read / file_read_baseline.
- ``checksum_gbps``: `crc32c_batch` over the same slices.
The report names the backend that ran and its flags; ``device`` holds H2D / D2H / D2D
figures of each usable GPU backend (`tierd.native.device_check`), empty without one.
Then `tierd.bench_store` measures how fast a dialogue's chain comes back into L1 through
the store itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tierd.native as native
from tierd.bench_store import measure_chain


def _best(repeat: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _fill(arena: native.HostArena, nbytes: int) -> None:
    block = os.urandom(min(nbytes, 4 << 20))
    view = memoryview(arena)
    try:
        for off in range(0, nbytes, len(block)):
            n = min(len(block), nbytes - off)
            view[off : off + n] = block[:n]
    finally:
        view.release()


def run(slices: int, slice_bytes: int, directory: Path, repeat: int) -> dict[str, Any]:
    total = slices * slice_bytes
    offsets = [i * slice_bytes for i in range(slices)]
    sizes = [slice_bytes] * slices
    src = native.HostArena(total)
    dst = native.HostArena(total)
    try:
        _fill(src, total)
        _fill(dst, total)  # fault every page in before any timing
        copy_s = _best(repeat, lambda: native.copy_batch(dst, offsets, src, offsets, sizes))
        memcpy_s = _best(repeat, lambda: native.memcpy_single(dst, 0, src, 0, total))
        crc_s = _best(repeat, lambda: native.crc32c_batch(src, offsets, sizes))

        directory.mkdir(parents=True, exist_ok=True)
        paths = [str(directory / f"{i:06d}.slice") for i in range(slices)]
        written = native.write_batch(paths, src, offsets, sizes, fsync=True)
        if any(n != slice_bytes for n in written):
            raise OSError(f"writing the bench files failed: {sorted(set(written))[:5]}")
        direct, why = native.probe_direct(directory)

        def parallel() -> None:
            got = native.read_batch(paths, dst, offsets, sizes, direct=direct)
            if any(n != slice_bytes for n in got):
                raise OSError("short parallel read")

        def sequential() -> None:
            got = native.read_batch(paths, dst, offsets, sizes, threads=1)
            if any(n != slice_bytes for n in got):
                raise OSError("short sequential read")

        def buffered_parallel() -> None:
            got = native.read_batch(paths, dst, offsets, sizes, direct=False)
            if any(n != slice_bytes for n in got):
                raise OSError("short buffered parallel read")

        def cold(fn: Callable[[], None]) -> float:
            best = float("inf")
            for _ in range(repeat):
                dropped = native.drop_page_cache(paths)
                if any(dropped):
                    raise OSError(f"dropping the page cache failed: {sorted(set(dropped))}")
                best = min(best, _best(1, fn))
            return best

        read_s = cold(parallel)
        base_s = cold(sequential)
        buffered_s = cold(buffered_parallel)
        intact = native.crc32c_batch(dst, offsets, sizes) == native.crc32c_batch(
            src, offsets, sizes
        )
    finally:
        src.close()
        dst.close()
    selected = next((k for k, v in native.backends().items() if v.get("selected")), "?")
    return {
        "slices": slices,
        "slice_bytes": slice_bytes,
        "total_bytes": total,
        "repeat": repeat,
        "host_copy_gbps": total / copy_s / 1e9,
        "memcpy_baseline_gbps": total / memcpy_s / 1e9,
        "copy_vs_memcpy": memcpy_s / copy_s,
        "file_read_gbps": total / read_s / 1e9,
        "file_read_baseline_gbps": total / base_s / 1e9,
        "file_read_buffered_parallel_gbps": total / buffered_s / 1e9,
        "parallel_read_speedup": base_s / read_s,
        "checksum_gbps": total / crc_s / 1e9,
        "read_back_intact": intact,
        "o_direct": direct,
        "o_direct_reason": why or ("" if direct else "refused by the filesystem"),
        "page_cache": "fdatasync + posix_fadvise(DONTNEED) on every file before each read run",
        "targets": {
            "host_copy_ge_0.8_memcpy": memcpy_s / copy_s >= 0.8,
            "parallel_read_speedup_ge_2": base_s / read_s >= 2.0,
        },
        "directory": str(directory),
        "implementation": native.IMPLEMENTATION,
        "backend": selected,
        "flags": {
            k: v
            for k, v in native.backends()[selected].items()
            if k in {"crc32c_hw", "o_direct", "threads", "copy_threads_max", "io_threads_max"}
        },
        "backends": native.backends(),
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
    }


def _device_figures(slices: int, slice_bytes: int, repeat: int) -> dict[str, Any]:
    """H2D / D2H / D2D copy_batch figures of every usable GPU backend (none here: {})."""
    from tierd.native.device_check import check_extension

    out: dict[str, Any] = {}
    for name, row in native.backends().items():
        if name in {"cuda", "hip"} and row["usable"]:
            try:
                figures = check_extension(name, slices, slice_bytes, repeat)
                figures.pop("backends", None)
                out[name] = figures
            except (RuntimeError, ValueError, OSError) as exc:
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tierd bench", description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, help="write the report here (and print it)")
    p.add_argument("--slices", type=int, default=4096)
    p.add_argument("--slice-bytes", type=int, default=256 * 1024)
    p.add_argument("--dir", type=Path, help="where the slice files go (a temp dir inside it)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--chain-slices",
        type=int,
        default=512,
        help="slices of the dialogue chain loaded through the store (0: skip that part)",
    )
    args = p.parse_args(argv)
    parent = args.dir or Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="tierd-bench-", dir=parent))
    try:
        report = run(args.slices, args.slice_bytes, directory, max(1, args.repeat))
        report["device"] = _device_figures(args.slices, args.slice_bytes, max(1, args.repeat))
        if args.chain_slices > 0:
            report.update(
                asyncio.run(
                    measure_chain(
                        args.chain_slices, args.slice_bytes, directory / "store", args.repeat
                    )
                )
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0
