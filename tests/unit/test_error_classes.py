"""Errors the product raises for values out of range (the router, tierd, the simulator, the
gateway's JSON codec) are in the exception tree (`contracts.errors`), and still the
ValueError their callers catch. No ValueError, RuntimeError or TypeError is raised bare
anywhere in the product (an AST walk), and the C extensions raise the very classes of
their pure-Python twins (`router.errors`, `tierd.native.errors`) for the same bad input."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from contracts.errors import ConfigurationError, InputError, UpstreamError, WarmgateError
from contracts.tiers import Tier
from gateway.http.asgi_app import GatewayApp
from gateway.json_codec import decode
from gateway.launch.process import ProcessTree, wait_http
from gateway.launch.vllm_fleet import FleetConfig, VllmFleet
from gateway.pipeline.tokens import load_tokenizer
from gateway.pipeline.world_versions import VersionDetector
from gateway.upstream.transport import Target, check_header_values
from router.blocks import hash_blocks
from router.errors import AccelArgumentTypeError, BlockSizeError
from router.footprints import SessionFootprints
from router.index import PrefixIndex
from router.precise import VllmBlockHasher, Xxh3BlockHasher, cut_blocks
from sim.cluster.kvcache import L1Store, LruStore
from sim.cluster.reuse import reusable_tokens
from sim.engine.block_hash import BlockHasher
from sim.engine.kv_events import EnginePublisher
from sim.engine.output import OutputText
from sim.engine.prefix_cache import Allocation, PrefixCache
from sim.players.encode import ChainIds
from sim.players.params import GameParams
from sim.profiles import get_profile
from sim.traces import unshared_blocks
from tests.unit.accel_impls import accel_module
from tests.unit.native_impls import c_extension
from tierd.connector.layout import layer_runs
from tierd.emulation import Emulator
from tierd.native import _fallback
from tierd.native.errors import BackendUnavailableError
from tierd.slices import make_meta
from tierd.tiers.l1_arena import L1Arena


@pytest.mark.parametrize(
    ("call", "phase"),
    [
        (lambda: PrefixIndex(ttl_s=0), ConfigurationError),
        (lambda: PrefixIndex(capacity_blocks=0), ConfigurationError),
        (lambda: PrefixIndex().insert("a", [1], Tier.HOST, predicted=True), InputError),
        (lambda: SessionFootprints(quantile=1.5), ConfigurationError),
        (lambda: SessionFootprints(max_sessions=0), ConfigurationError),
        (lambda: hash_blocks("text", seed=0, block_chars=0), ConfigurationError),
        (lambda: cut_blocks([1, 2], 0), ConfigurationError),
        (lambda: VllmBlockHasher(hash_seed="0", algo="sha1"), ConfigurationError),  # type: ignore[arg-type]
        (lambda: Xxh3BlockHasher(model="m", block_size=2).block_hashes([-1, 2]), InputError),
        (lambda: make_meta(1 << 64, b"x", None, None), InputError),
        (lambda: make_meta(1, b"x", -1, None), InputError),
        (lambda: make_meta(1, b"x", None, 1 << 32), InputError),
        (lambda: GameParams(players=0), ConfigurationError),
        (lambda: LruStore(-1, print), ConfigurationError),
        (lambda: L1Store(0, print), ConfigurationError),
        (lambda: ChainIds(0), ConfigurationError),
        (lambda: decode("[" * 100_000), InputError),
        (lambda: Target.parse("https://engine:9000"), ConfigurationError),
        (lambda: check_header_values({"x-a": "1\r\nx-b: 2"}), InputError),
        (lambda: load_tokenizer("no_colon"), ConfigurationError),
        (lambda: BlockHasher(16, "md5"), ConfigurationError),
        (lambda: BlockHasher(16, seed="0").block(None, [1, 2, 3]), InputError),
        (lambda: EnginePublisher("tcp://127.0.0.1:1", encoding="yaml"), ConfigurationError),
        (lambda: PrefixCache(8, 16), ConfigurationError),
        (lambda: Emulator("no-such-profile"), ConfigurationError),
        (lambda: Emulator(None, time_scale=0), ConfigurationError),
        (lambda: L1Arena(1024, 4096, backend="host"), ConfigurationError),
        (lambda: layer_runs([4, 8], [8, 1], 2, 0, num_blocks=3), ConfigurationError),
        (lambda: unshared_blocks([], 0), ConfigurationError),
        (lambda: reusable_tokens([], 0), ConfigurationError),
        (lambda: get_profile("no-such-profile"), ConfigurationError),
        (lambda: VersionDetector(window_s=0), ConfigurationError),
        (lambda: PrefixCache(64, 16).commit(Allocation(), b"h", None, [1]), InputError),
    ],
)
def test_a_value_out_of_range_is_a_warmgate_error_and_a_value_error(
    call: Callable[[], object], phase: type[WarmgateError]
) -> None:
    with pytest.raises(phase) as info:
        call()
    assert isinstance(info.value, ValueError)


def test_a_refused_call_that_was_a_runtime_error_is_in_the_tree() -> None:
    output = OutputText(["stop"])
    assert output.append("a stop")
    with pytest.raises(InputError) as stopped:
        output.append("more")
    assert isinstance(stopped.value, RuntimeError)
    with pytest.raises(ConfigurationError) as refused:
        GatewayApp().add_middleware(object)
    assert isinstance(refused.value, RuntimeError)


def test_a_supervised_child_that_fails_or_never_answers_is_an_upstream_error(
    tmp_path: Path,
) -> None:
    gone = ProcessTree.start("gone", [sys.executable, "-c", "pass"], tmp_path / "gone.log")
    try:
        with pytest.raises(UpstreamError) as info:
            wait_http(gone, "http://127.0.0.1:9/", timeout_s=30)
        assert isinstance(info.value, RuntimeError)
    finally:
        gone.stop(timeout_s=5)
    mute = ProcessTree.start(
        "mute", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "mute.log"
    )
    try:
        with pytest.raises(UpstreamError) as info:
            wait_http(mute, "http://127.0.0.1:9/", timeout_s=0.3)
        assert isinstance(info.value, TimeoutError)
    finally:
        mute.stop(timeout_s=5)


def test_a_fleet_vllm_cannot_start_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as info:
        VllmFleet(FleetConfig(model_dir=tmp_path, engines=0))
    assert isinstance(info.value, ValueError)


# --- no bare builtin raise in the product -------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("contracts", "router", "tierd", "gateway", "sim")
BARE = {"ValueError", "RuntimeError", "TypeError"}
# (path, builtin) -> why it stays bare
ALLOWED_BARE = {
    ("gateway/launch/tiny_model_build.py", "RuntimeError"): (
        "a standalone script run with the engine's python, importing nothing of warmgate's; "
        "its failure reaches warmgate as the build's exit status (ModelBuildError)"
    ),
}


def _bare_in(source: str, where: str = "<test>") -> list[tuple[int, str]]:
    """(line, builtin) of every `raise ValueError(...)` / `raise TypeError` ... in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id in BARE:
            found.append((node.lineno, exc.id))
    return found


def _bare_raises() -> list[tuple[str, int, str]]:
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found += [(rel, line, name) for line, name in _bare_in(path.read_text(), rel)]
    return found


def test_the_product_raises_no_bare_value_runtime_or_type_error() -> None:
    """Every ValueError, RuntimeError and TypeError the product raises is a class of the tree
    (one that is still that builtin), so `except WarmgateError` and the phases catch it."""
    found = _bare_raises()
    unexpected = [f"{p}:{line} {name}" for p, line, name in found if (p, name) not in ALLOWED_BARE]
    assert unexpected == []
    assert {(p, name) for p, _, name in found} == set(ALLOWED_BARE)  # no stale allowance


def test_the_walk_sees_every_form_of_a_bare_raise() -> None:
    code = (
        "def f():\n    raise ValueError('x')\n"
        "def g():\n    raise TypeError\n"
        "def h():\n    try:\n        pass\n    except KeyError:\n"
        "        raise RuntimeError('y') from None\n"
        "def k():\n    raise KeyError('a KeyError is not looked for')\n"
    )
    assert _bare_in(code) == [(2, "ValueError"), (4, "TypeError"), (9, "RuntimeError")]


# --- the C extensions and their pure-Python twins raise the same classes ------------------


def _host_copier_closed(impl: ModuleType) -> None:
    copier = impl.BlockCopier("host")
    copier.close()
    copier.copy([], 0, [], bytearray(8), [], to_host=True)


NATIVE_BAD_CALLS: dict[str, Callable[[ModuleType], object]] = {
    "negative size": lambda n: n.copy_batch(bytearray(8), [0], bytearray(8), [0], [-1]),
    "read-only destination": lambda n: n.copy_batch(b"12345678", [0], bytearray(8), [0], [1]),
    "not a buffer": lambda n: n.copy_batch(object(), [0], bytearray(8), [0], [1]),
    "offsets not ints": lambda n: n.copy_batch(bytearray(8), ["a"], bytearray(8), [0], [1]),
    "lengths differ": lambda n: n.copy_batch(bytearray(8), [0, 1], bytearray(8), [0], [1]),
    "destinations overlap": lambda n: n.copy_batch(
        bytearray(8), [0, 2], bytearray(8), [0, 4], [4, 4]
    ),
    "negative threads": lambda n: n.copy_batch(
        bytearray(8), [0], bytearray(8), [0], [1], threads=-1
    ),
    "empty arena": lambda n: n.HostArena(0),
    "arena write at a negative offset": lambda n: n.HostArena(4096).write(-1, b"x"),
    "crc outside 32 bits": lambda n: n.crc32c(b"abc", value=1 << 32),
    "crc at a negative offset": lambda n: n.crc32c(b"abc", -1),
    "unknown backend": lambda n: n.BlockCopier("nope"),
    "negative device": lambda n: n.BlockCopier("host", device=-1),
    "unknown ticket": lambda n: n.BlockCopier("host").wait(5),
    "malformed layer": lambda n: n.BlockCopier("host").copy(
        [(1, 2)], 1, [0], bytearray(8), [0], to_host=True
    ),
    "closed copier": _host_copier_closed,
}


def _raised(call: Callable[[ModuleType], object], impl: ModuleType) -> BaseException:
    """What `call(impl)` raises (any exception: its class is what the tests compare)."""
    with pytest.raises(Exception) as info:
        call(impl)
    return info.value


@pytest.mark.parametrize("case", sorted(NATIVE_BAD_CALLS))
def test_tierd_native_raises_the_same_tree_class_in_c_and_in_python(case: str) -> None:
    call = NATIVE_BAD_CALLS[case]
    c_exc, py_exc = _raised(call, c_extension()), _raised(call, _fallback)
    assert type(c_exc) is type(py_exc), (c_exc, py_exc)
    assert type(c_exc).__module__ == "tierd.native.errors"
    assert isinstance(c_exc, WarmgateError)


def test_a_gpu_backend_that_is_not_usable_is_the_same_class_in_c_and_in_python() -> None:
    native = c_extension()
    if native.backends()["cuda"]["usable"]:
        pytest.skip("a CUDA device is usable here: DeviceArena does not fail")
    for call in (lambda n: n.DeviceArena(4096, "cuda"), lambda n: n.BlockCopier("cuda")):
        c_exc, py_exc = _raised(call, native), _raised(call, _fallback)
        assert type(c_exc) is type(py_exc) is BackendUnavailableError
        assert isinstance(c_exc, RuntimeError) and isinstance(c_exc, ConfigurationError)


ACCEL_BAD_CALLS: dict[str, Callable[[ModuleType], object]] = {
    "seed not an int": lambda a: a.hash_blocks(b"abcd", 1.5, 2),
    "block_chars not an int": lambda a: a.hash_blocks(b"abcd", 1, "2"),
    "block_chars zero": lambda a: a.hash_blocks(b"abcd", 1, 0),
    "blocks neither a BlockMap nor a dict": lambda a: a.lookup_runs([], [1]),
}


@pytest.mark.parametrize("case", sorted(ACCEL_BAD_CALLS))
def test_router_accel_raises_the_same_tree_class_in_c_and_in_python(case: str) -> None:
    call = ACCEL_BAD_CALLS[case]
    c_exc, py_exc = _raised(call, accel_module("c")), _raised(call, accel_module("python"))
    assert type(c_exc) is type(py_exc), (c_exc, py_exc)
    assert type(c_exc) in {AccelArgumentTypeError, BlockSizeError}
    assert isinstance(c_exc, WarmgateError)


def test_a_block_map_key_or_value_of_the_wrong_type_is_an_accel_argument_type_error() -> None:
    table = accel_module("c").new_block_map()
    with pytest.raises(AccelArgumentTypeError):
        table["1"] = 1
    with pytest.raises(AccelArgumentTypeError):
        table[1] = "1"
