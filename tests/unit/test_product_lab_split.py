"""Product and lab apart: the gateway's runtime dependencies hold no numpy or matplotlib
(they are the `lab` extra), and the product's modules import without them while a lab
command says which extra it needs."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAB = ("numpy", "matplotlib")

# imports the product (gateway, tierd, the simulated engine `warmgate up` starts) with the
# lab's libraries made unimportable, then asks for a lab command
PROBE = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"numpy", "matplotlib"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
import gateway.app, gateway.launch.up, gateway.launch.serve
import tierd.serve, tierd.native, sim.engine.app
from gateway.cli import main
raise SystemExit(main(["bench", "cluster", "--help"]))
"""


def test_runtime_dependencies_leave_the_lab_out() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = " ".join(project["dependencies"])
    assert not any(name in runtime for name in LAB)
    lab = " ".join(project["optional-dependencies"]["lab"])
    assert all(name in lab for name in LAB)


def test_the_product_runs_without_the_lab() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "needs the lab extra" in proc.stderr and "warmgate[lab]" in proc.stderr
