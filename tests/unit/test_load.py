"""LoadView: in-flight and queued prefill tokens through a request's life, remote counts."""

from __future__ import annotations

from router.load import LoadView


def test_lifecycle_counts() -> None:
    load = LoadView()
    assert load.view("a") == (0, 0)
    load.on_dispatch("a", 100)
    load.on_dispatch("a", 50)
    assert load.view("a") == (2, 150)
    load.on_first_token("a", 100)
    assert load.view("a") == (2, 50)
    load.on_finish("a", 100, got_first_token=True)
    assert load.view("a") == (1, 50)
    load.on_finish("a", 50, got_first_token=False)  # failed before its first token
    assert load.view("a") == (0, 0)


def test_never_negative() -> None:
    load = LoadView()
    load.on_finish("a", 10, got_first_token=False)
    load.on_first_token("a", 10)
    assert load.view("a") == (0, 0)


def test_remote_in_flight_adds_to_local() -> None:
    load = LoadView()
    load.on_dispatch("a", 10)
    load.set_remote("a", 3)
    assert load.view("a") == (4, 10)
    assert load.local_in_flight("a") == 1
    load.set_remote("a", 1)  # replaces, does not add
    assert load.view("a") == (2, 10)
    assert load.snapshot()["a"] == {
        "in_flight": 2,
        "local_in_flight": 1,
        "remote_in_flight": 1,
        "queued_prefill_tokens": 10,
    }
