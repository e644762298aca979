"""One exception tree: every exception class defined in warmgate's packages derives from
`contracts.errors.WarmgateError` (a phase of it), and the classes that were a ValueError,
RuntimeError or OSError still are one."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import contracts
import gateway
import router
import sim
import tierd
from contracts.errors import InputError, UpstreamError, WarmgateError
from contracts.kv_events import MalformedEventError
from gateway.upstream.relay import AttemptFailed, AttemptRead, EngineServerError
from tierd.client import TierdError

PRIVATE = {
    "gateway.http.listener._HeadersTooLarge",
    "gateway.launch.banner.Interrupted",
}  # control flow


def _modules() -> list[str]:
    names = []
    for pkg in (contracts, gateway, router, sim, tierd):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            names.append(info.name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_every_exception_class_is_a_warmgate_error(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # modules of the engine environment (vllm) or native builds
        assert (exc.name and exc.name.split(".")[0] in {"vllm", "torch"}) or "_" in exc.name
        return
    for cls_name, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != name or not issubclass(cls, BaseException):
            continue
        if f"{name}.{cls_name}" in PRIVATE:
            continue
        assert issubclass(cls, WarmgateError), f"{name}.{cls_name} is outside the tree"


def test_phases_and_old_bases_hold() -> None:
    assert issubclass(MalformedEventError, InputError) and issubclass(
        MalformedEventError, ValueError
    )
    assert issubclass(TierdError, UpstreamError) and issubclass(TierdError, RuntimeError)
    assert issubclass(AttemptRead, AttemptFailed) and AttemptRead.kind == "read"
    assert EngineServerError("x", (500, b"", {})).response == (500, b"", {})


def test_no_two_exception_classes_share_a_name() -> None:
    """One name, one class: an `except UpstreamError` must not depend on which one it got."""
    seen: dict[str, str] = {}
    twice = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue  # the engine environment's and native modules (checked above)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, BaseException):
                continue
            if cls_name in seen:
                twice.append(f"{cls_name}: {seen[cls_name]} and {name}")
            seen[cls_name] = name
    assert twice == []
