"""One-command check of the connector's block copies on whatever device torch has.

    .venv-vllm/bin/python -m tierd.connector.device_check [--tierd-python .venv/bin/python]
        [--json OUT] [--quick]

Run with the engine's python (torch) from the repository root. Two parts:

1. Through a real tierd (started with warmgate's python on a KV socket): for each KV layout
   (`copy_bench.LAYOUTS`; 128-token blocks for the CPU layout, 16 for the GPU ones) and each
   copy path (the native one `copier.choose` picks here — host backend on a CPU, CUDA/HIP
   on a GPU — and torch), random KV tensors on the device are saved to tierd (on the async
   saver's thread, as the connector does by default), zeroed, loaded back and compared bit
   for bit.
2. Without tierd (`copy_bench.run_layout`): the native path against torch's copies of the
   same blocks, bytes compared both ways, bad input refused (IndexError / ValueError), and
   GB/s of each (`--quick`: small sizes, for CI on a CPU).

Prints one JSON report (and writes it to --json); exits 1 if anything differs or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from contracts.errors import UpstreamError
from contracts.slices import normalize
from tierd.connector import copy_bench
from tierd.connector.saver import AsyncSaver
from tierd.connector.worker import BlockMover


class TierdNotStartedError(UpstreamError, RuntimeError):
    """The tierd this check started exited or never opened its KV socket."""


def start_tierd(
    python: str, run_dir: Path, slice_bytes: int
) -> tuple[subprocess.Popen[bytes], Path]:
    sock = run_dir / "check.sock"
    proc = subprocess.Popen(
        [
            python, "-m", "tierd.cli", "serve", "--port", "0", "--kv-socket", str(sock),
            "--l1-bytes", str(64 * slice_bytes), "--slice-bytes", str(slice_bytes),
            "--array-dir", str(run_dir / "array"), "--snapshot-dir", str(run_dir / "snap"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise TierdNotStartedError("tierd did not open its KV socket")
        time.sleep(0.05)
    return proc, sock


LAYERS, HEADS, DIM, NUM_BLOCKS = 3, 2, 64, 32


def block_size(layout: str) -> int:
    return 128 if layout == "cpu" else 16  # vLLM's block sizes: CPU 128, GPU 16


def round_trip(layout: str, device: str, torch_copies: bool, sock: Path) -> dict[str, Any]:
    bs = block_size(layout)
    base, kv = copy_bench.make_kv(layout, LAYERS, NUM_BLOCKS, bs, HEADS, DIM, device)
    counters: Counter[str] = Counter()
    mover = BlockMover(
        kv, NUM_BLOCKS, str(sock), "device-check", counters, torch_copies=torch_copies
    )
    blocks = [3, 4, 9, 30]
    keys = [normalize(hash((layout, torch_copies, b))) for b in blocks]
    want = base.clone()
    # as the connector saves by default: on the saver's thread, after the engine's stream
    saver = AsyncSaver(mover, counters)
    saver.submit([(k, b, None) for k, b in zip(keys, blocks, strict=True)], bs,
                 mover.current_stream())  # fmt: skip
    saver.close()  # the copies are enqueued (GPU) or done (host)
    mover.poll(wait=True)  # a GPU save commits once its copies are done
    time.sleep(0.2)  # tierd checksums and installs the commit on its own time
    bdim = copy_bench.BLOCK_DIM[layout] + 1
    base.index_fill_(bdim, torch.tensor(blocks, device=device), 0)
    zeroed = not torch.equal(base, want)  # else the check below could not fail
    failed = mover.load(list(zip(keys, blocks, strict=True)))
    if base.device.type == "cuda":
        torch.cuda.synchronize()
    mover.close()
    return {
        "layout": layout,
        "device": device,
        "block_size": bs,
        "copies": mover.copy_path,
        "slice_bytes": mover.layout.slice_bytes,
        "failed_blocks": sorted(failed),
        "equal": zeroed and not failed and bool(torch.equal(base, want)),
        "counters": dict(counters),
    }


def tierd_slice_bytes() -> int:
    """The largest slice of any layout here (tierd's slots must hold one)."""
    return max(LAYERS * 2 * block_size(name) * HEADS * DIM * 2 for name in copy_bench.LAYOUTS)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tierd.connector.device_check")
    p.add_argument("--tierd-python", default=str(Path(".venv/bin/python")))
    p.add_argument("--json", type=Path)
    p.add_argument("--quick", action="store_true", help="small copy benchmark (CI on a CPU)")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    checks: list[dict[str, Any]] = []
    tierd_error = None
    with tempfile.TemporaryDirectory(prefix="wg-dc-") as d:
        try:
            proc, sock = start_tierd(args.tierd_python, Path(d), tierd_slice_bytes())
        except (OSError, RuntimeError) as exc:  # still run the copy benchmark below
            tierd_error = f"{type(exc).__name__}: {exc}"
        else:
            try:
                for layout in copy_bench.LAYOUTS:
                    for torch_copies in (False, True):
                        checks.append(round_trip(layout, device, torch_copies, sock))
            finally:
                proc.terminate()
                proc.wait(10)
    quick = args.quick or device == "cpu"
    size: dict[str, int] = (
        {"layers": 4, "nb": 64, "heads": 2, "dim": 64, "nblocks": 16, "repeat": 3}
        if quick
        else {"layers": 32, "nb": 1024, "heads": 8, "dim": 128, "nblocks": 256, "repeat": 5}
    )
    bench = [  # on a GPU every layout with GPU-sized blocks (the CPU one too, for comparison)
        copy_bench.run_layout(name, device, bs=16 if device != "cpu" else block_size(name), **size)
        for name in copy_bench.LAYOUTS
    ]
    round_trip_ok = bool(checks) and all(c["equal"] for c in checks)
    bench_ok = all(b.get("ok") for b in bench)
    ok = round_trip_ok and bench_ok
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip}
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
    report = {"ok": ok, "device": device, **info, "pid": os.getpid(), "bench_size": size}
    report.update({"round_trip_ok": round_trip_ok, "bench_ok": bench_ok})
    report["tierd_error"] = tierd_error  # e.g. tierd's packages missing where torch is
    report.update({"checks": checks, "bench": bench})
    text = json.dumps(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
