"""One-command check of the connector's block copies on whatever device torch has.

    .venv-vllm/bin/python -m tierd.connector.device_check [--tierd-python .venv/bin/python]

Run with the engine's python (torch) from the repository root. Starts a real tierd (with
warmgate's python) on a KV socket, then for each KV layout vLLM uses (CPU; FlashAttention's
K/V-first; FlashInfer's blocks-first) and each copy path (torch copies: the device path;
the native module's copy_batch: host KV only) builds random KV tensors on the device,
saves blocks to tierd, zeroes them, loads them back and compares bit for bit. Prints one
JSON report; exits 1 if any block differs. On a CPU-only machine the device path runs with
CPU tensors (the same code, no device transfer).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tierd.connector.worker import BlockMover

LAYOUTS: dict[str, Callable[[int, int, int, int], tuple[int, ...]]] = {
    "cpu": lambda nb, bs, h, d: (nb, h, bs, 2 * d),
    "flash_attn": lambda nb, bs, h, d: (2, nb, bs, h, d),
    "flashinfer": lambda nb, bs, h, d: (nb, 2, h, bs, d),
}


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
            raise RuntimeError("tierd did not open its KV socket")
        time.sleep(0.05)
    return proc, sock


def check(layout: str, device: str, torch_copies: bool, sock: Path) -> dict[str, Any]:
    nb, bs, heads, dim, layers = 32, 16, 4, 64, 3
    shape = LAYOUTS[layout](nb, bs, heads, dim)
    base = torch.randn((layers, *shape), dtype=torch.float16, device=device)
    kv = {f"layer.{i}": base[i] for i in range(layers)}  # views into one buffer, as vLLM's
    counters: Counter[str] = Counter()
    mover = BlockMover(kv, nb, str(sock), "device-check", counters, torch_copies=torch_copies)
    blocks = [3, 4, 9, 30]
    keys = [hash((layout, torch_copies, b)) & ((1 << 64) - 1) for b in blocks]
    want = base.clone()
    mover.save([(k, b, None) for k, b in zip(keys, blocks, strict=True)], bs)
    time.sleep(0.2)  # tierd checksums and installs the commit on its own time
    bdim = 1 if layout == "flash_attn" else 0
    for layer in kv.values():
        layer.index_fill_(bdim, torch.tensor(blocks, device=device), 0)
    zeroed = not torch.equal(base, want)  # else the check below could not fail
    failed = mover.load(list(zip(keys, blocks, strict=True)))
    mover.close()
    return {
        "layout": layout,
        "device": device,
        "copies": "torch" if mover.on_device else "native",
        "slice_bytes": mover.layout.slice_bytes,
        "failed_blocks": sorted(failed),
        "equal": zeroed and not failed and bool(torch.equal(base, want)),
        "counters": dict(counters),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tierd.connector.device_check")
    p.add_argument("--tierd-python", default=str(Path(".venv/bin/python")))
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    with tempfile.TemporaryDirectory(prefix="wg-dc-") as d:
        proc, sock = start_tierd(args.tierd_python, Path(d), 3 * 16 * 2 * 4 * 64 * 2)
        try:
            for layout in LAYOUTS:
                results.append(check(layout, device, True, sock))
                if device == "cpu":
                    results.append(check(layout, device, False, sock))
        finally:
            proc.terminate()
            proc.wait(10)
    ok = all(r["equal"] for r in results)
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip}
    print(json.dumps({"ok": ok, "device": device, **info, "pid": os.getpid(), "checks": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
