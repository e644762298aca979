"""`warmgate up --engine vllm`: real engines and the gateway in one command, and nothing of
them left once it is stopped, whatever signal stops it."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from openai import OpenAI

from gateway.launch.process import descendants_of
from tests.support.procs import ManagedProcess, free_port
from tests.support.vllm import SERVED_MODEL, VllmFleets

pytestmark = [pytest.mark.slow, pytest.mark.engines]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def test_up_serves_the_sdk_and_sighup_leaves_no_process(
    vllm_fleets: VllmFleets, tmp_path: Path
) -> None:
    vllm_fleets.prepare()  # the engine env (skip, or fail in CI) and the model, built once
    vllm_fleets.release()  # this test's engine takes the memory the session fleet held
    port = free_port()
    up = ManagedProcess(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "up",
            "--engine",
            "vllm",
            "--instances",
            "1",
            "--port",
            str(port),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        tmp_path / "up.log",
    )
    try:
        deadline = time.monotonic() + 300
        while "warmgate is up" not in up.tail(200):
            assert up.proc.poll() is None, up.tail()
            assert time.monotonic() < deadline, up.tail()
            time.sleep(0.5)
        # the gateway reads the model's tokenizer files itself (the tokenizer extra is in dev)
        assert (
            "precise mode (block size 128, sha256_cbor, tokens from the model directory)"
            in up.tail(200)
        )
        assert "(KV connector, shared array" in up.tail(200)  # a tierd beside the engine
        tree = descendants_of(up.proc.pid)
        assert len(tree) >= 4, tree  # the gateway, an API server, its EngineCore and Worker
        c = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "[up-test] " + "the king sees the dragon " * 60}]
        first = c.chat.completions.create(
            model=SERVED_MODEL,
            messages=messages,
            max_tokens=4,  # type: ignore[arg-type]
        )
        again = c.chat.completions.create(
            model=SERVED_MODEL,
            messages=messages,
            max_tokens=4,  # type: ignore[arg-type]
        )
        assert first.usage is not None and again.usage is not None
        assert again.usage.prompt_tokens_details is not None
        assert again.usage.prompt_tokens_details.cached_tokens == (
            (first.usage.prompt_tokens - 1) // 128 * 128
        )
        # the Responses API (issue 23) against the real engine: plain, instructions + items,
        # and the typed stream, translated to chat completions by the gateway
        plain = c.responses.create(model=SERVED_MODEL, input="[up-test] hello", max_output_tokens=4)
        assert plain.status in ("completed", "incomplete") and plain.output_text
        assert plain.usage is not None and 0 < plain.usage.output_tokens <= 4
        items = c.responses.create(
            model=SERVED_MODEL,
            instructions="You are Brom, the village blacksmith.",
            input=[{"role": "user", "content": "[up-test] a sword, please"}],
            max_output_tokens=4,
        )
        assert items.status in ("completed", "incomplete") and items.output_text
        stream = c.responses.create(
            model=SERVED_MODEL, input="[up-test] tell me", max_output_tokens=4, stream=True
        )
        kinds = [e.type for e in stream]
        assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
        assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
        up.proc.send_signal(signal.SIGHUP)
        assert up.proc.wait(timeout=60) == 0, up.tail()
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in tree if _alive(p)] == [], up.tail()
    finally:
        up.stop()
