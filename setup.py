"""Build hook: compiles tierd's native copy module (see tierd/native/) and the router's
accelerated hot loops (`router._accel`, see router/accel.py).

- The CPython extension `tierd.native._native` (C, host backend: copies, file batches,
  CRC-32C). If it fails to compile, the install goes on and tierd uses the pure-Python
  fallback, saying so in `tierd.native.backends()`.
- One shared library per GPU runtime whose compiler is present, from the same source
  (`gpu_backend.cu` + `gpu_compat.h`), next to the extension: `_wg_cuda.so` (nvcc) and
  `_wg_hip.so` (hipcc, `HIP_PLATFORM=amd`, `--offload-arch=$WARMGATE_HIP_ARCH`, default gfx90a;
  production MI300: gfx942). They are dlopened at run time only where a device is present.
  A failed GPU build is reported and skipped, except under `CI=true`, where any build failure
  fails the install: CI exists to prove that everything compiles.
- The CPython extension `router._accel` (C, `router/_accel.c`: prompt block hashing and the
  prefix index walk; `router/blockmap.c`: the index's block table). It compiles xxHash in
  from its header (`xxhash.h`, Debian/Ubuntu package `libxxhash-dev`); without it the
  router uses its pure-Python versions, except under `CI=true`, where the build must
  succeed.

Settings (environment): WARMGATE_GPU_BACKENDS = auto | none | comma list of cuda,hip;
WARMGATE_HIP_ARCH; WARMGATE_CUDA_ARCH (optional -arch for nvcc); NVCC, HIPCC (compilers).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = Path("tierd") / "native"
# every C file of the module (the GPU backend is the .cu, built apart)
C_SOURCES = sorted(p.name for p in NATIVE.glob("*.c"))
GPU_SOURCE = NATIVE / "gpu_backend.cu"
TIERD_EXT = "tierd.native._native"
ROUTER = Path("router")
# the module (hot loops), the block table it walks (its Python type) and the table's storage
ROUTER_ACCEL_SOURCES = [ROUTER / "_accel.c", ROUTER / "blockmap.c", ROUTER / "blockmap_table.c"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _log(msg: str) -> None:
    print(f"[warmgate native build] {msg}", file=sys.stderr, flush=True)


def _find_nvcc() -> str | None:
    for cand in (
        os.environ.get("NVCC"),
        shutil.which("nvcc"),
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
    ):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def _find_hipcc() -> str | None:
    for cand in (os.environ.get("HIPCC"), shutil.which("hipcc"), "/opt/rocm/bin/hipcc"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def _gpu_commands(out_dir: Path) -> dict[str, tuple[list[str], dict[str, str]] | None]:
    """Compile command and environment per GPU backend (None: its compiler is absent)."""
    src, inc = str(GPU_SOURCE), str(NATIVE)
    cmds: dict[str, tuple[list[str], dict[str, str]] | None] = {"cuda": None, "hip": None}
    nvcc = _find_nvcc()
    if nvcc:
        cmd = [nvcc, "-O2", "-Xcompiler", "-fPIC,-fvisibility=default", "-shared", "-I", inc]
        if os.environ.get("WARMGATE_CUDA_ARCH"):
            cmd += ["-arch", os.environ["WARMGATE_CUDA_ARCH"]]
        cmd += ["-x", "cu", src, "-o", str(out_dir / "_wg_cuda.so")]
        cmds["cuda"] = (cmd, dict(os.environ))
    hipcc = _find_hipcc()
    if hipcc:
        arch = os.environ.get("WARMGATE_HIP_ARCH", "gfx90a")
        # Debian's hipcc (ROCm 5.2) picks the NVIDIA platform when it sees nvcc: force AMD.
        env = {**os.environ, "HIP_PLATFORM": "amd"}
        cmd = [hipcc, "-O2", "-fPIC", "-shared", "-DWG_HIP", f"--offload-arch={arch}"]
        cmd += ["-I", inc, "-x", "hip", src, "-o", str(out_dir / "_wg_hip.so")]
        cmds["hip"] = (cmd, env)
    return cmds


class BuildNative(build_ext):
    """build_ext that tolerates a failed C build (fallback) and adds the GPU libraries
    (beside tierd's extension)."""

    gpu_libs: list[Path]

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            if _in_ci():
                raise
            user = "tierd" if ext.name == TIERD_EXT else "the router"
            _log(
                f"C extension {ext.name} failed to build ({exc}); {user} will use the "
                "pure-Python fallback"
            )
            return
        if ext.name == TIERD_EXT:
            self.gpu_libs = self._build_gpu(Path(self.get_ext_fullpath(ext.name)).parent)

    def copy_extensions_to_source(self) -> None:
        """In-place and editable builds: the GPU libraries go beside the extension too."""
        super().copy_extensions_to_source()
        for name in ("cuda", "hip"):  # a backend that did not build leaves no older copy
            (NATIVE / f"_wg_{name}.so").unlink(missing_ok=True)
        for lib in getattr(self, "gpu_libs", []):
            self.copy_file(str(lib), str(NATIVE / lib.name), level=self.verbose)

    def get_outputs(self) -> list[str]:
        extra = [str(NATIVE / p.name) if self.inplace else str(p) for p in self.gpu_libs_built()]
        return [*super().get_outputs(), *extra]

    def gpu_libs_built(self) -> list[Path]:
        return list(getattr(self, "gpu_libs", []))

    def _build_gpu(self, out_dir: Path) -> list[Path]:
        built: list[Path] = []
        wanted = os.environ.get("WARMGATE_GPU_BACKENDS", "auto").strip().lower()
        if wanted == "none":
            _log("GPU backends disabled (WARMGATE_GPU_BACKENDS=none)")
            return built
        names = ["cuda", "hip"] if wanted == "auto" else [n.strip() for n in wanted.split(",")]
        out_dir.mkdir(parents=True, exist_ok=True)
        commands = _gpu_commands(out_dir)
        for name in names:
            if name not in commands:
                raise SystemExit(f"WARMGATE_GPU_BACKENDS: unknown backend {name!r}")
            spec = commands[name]
            if spec is None:
                msg = f"{name} backend not built: its compiler was not found"
                if wanted != "auto":
                    raise SystemExit(msg)
                _log(msg)
                continue
            cmd, env = spec
            Path(cmd[-1]).unlink(missing_ok=True)  # never leave an older build looking current
            _log(f"building the {name} backend: {' '.join(cmd)}")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                _log(f"{name} backend built: {cmd[-1]}")
                built.append(Path(cmd[-1]))
                continue
            why = (proc.stderr or proc.stdout).strip()[-4000:]
            if _in_ci() or wanted != "auto":
                raise SystemExit(f"{name} backend failed to build (CI=true):\n{why}")
            _log(f"{name} backend failed to build; skipped:\n{why}")
        return built


setup(
    ext_modules=[
        Extension(
            TIERD_EXT,
            sources=[str(NATIVE / s) for s in C_SOURCES],
            depends=[str(p) for p in NATIVE.glob("*.h")],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            libraries=["dl", "pthread"],
            optional=not _in_ci(),  # outside CI a failed build leaves the Python fallback
        ),
        Extension(
            "router._accel",
            sources=[str(p) for p in ROUTER_ACCEL_SOURCES],
            depends=[str(ROUTER / "blockmap.h")],
            # -O3: xxh3's seeded long-input path runs about twice as fast as at -O2
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=not _in_ci(),  # outside CI a failed build leaves the Python fallback
        ),
    ],
    cmdclass={"build_ext": BuildNative},
)
