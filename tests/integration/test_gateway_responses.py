"""`POST /v1/responses` with the official OpenAI SDK against a gateway in front of simulated
engines: plain, instructions plus message items, streamed (the typed events in order), the 400
naming a field the gateway cannot serve, and `previous_response_id` (the memory store; Redis
shared by two gateway replicas, its TTL; `store: false`; an unknown id)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from contracts.redis_keys import PoolKeys
from tests.e2e.fleet import MODEL, Fleet, wait_until
from tests.support.procs import ManagedProcess, free_port, python_module

PERSONA = "You are Brom, the village blacksmith of Eastmarch. " * 12


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("gw-responses"), 2).start()
    yield f
    f.stop()


@pytest.fixture
def client(fleet: Fleet) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{fleet.base}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_plain_string_input(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL, input="Hello, blacksmith!", max_output_tokens=8, metadata={"npc": "smith"}
    )
    assert r.id.startswith("resp_")
    assert r.object == "response"
    assert r.status in ("completed", "incomplete")
    assert r.metadata == {"npc": "smith"}
    assert len(r.output) == 1 and r.output[0].type == "message"
    assert r.output[0].content[0].type == "output_text"
    assert r.output_text
    assert r.usage is not None
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_instructions_and_items_route_as_chat(client: openai.OpenAI, fleet: Fleet) -> None:
    items = [
        {"role": "user", "content": "I need a sword."},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Steel or iron?"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Steel, please."}]},
    ]
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        instructions="You are Brom, the village blacksmith.",
        input=items,  # type: ignore[arg-type]
        temperature=0.2,
        top_p=0.9,
        prompt_cache_key="player-7",
    )
    r = raw.parse()
    assert r.status == "completed" and r.output_text
    assert r.instructions == "You are Brom, the village blacksmith."
    assert raw.headers.get("x-warmgate-instance") in {e.id for e in fleet.engines}
    # prompt_cache_key is the session key, as for chat
    session = httpx.get(f"{fleet.base}/admin/sessions/player-7", timeout=30).json()
    assert session["known"] and session["last_instance"] == raw.headers["x-warmgate-instance"]


def test_stream_events_in_order(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL,
            instructions="Be brief.",
            input="Any news?",
            max_output_tokens=6,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and kinds[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert kinds[4 + len(deltas) :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        kinds[-1],
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == text and text
    assert done.usage is not None and 0 < done.usage.output_tokens <= 6


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
    ],
)
def test_unservable_fields_are_400_naming_them(
    client: openai.OpenAI, fleet: Fleet, extra: dict[str, object], param: str
) -> None:
    body: dict[str, object] = {"model": MODEL, "input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/responses", body=body, cast_to=httpx.Response)
    err = info.value.body
    assert isinstance(err, dict) and err["param"] == param, err
    raw = httpx.post(f"{fleet.base}/v1/responses", json=body, timeout=30)
    assert raw.status_code == 400
    assert set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_text_format_and_store_are_accepted(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL,
        input="Name a sword.",
        store=False,
        max_output_tokens=4,
        text={
            "format": {
                "type": "json_schema",
                "name": "sword",
                "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
            }
        },
    )
    assert r.output_text and r.to_dict()["store"] is False
    assert r.text is not None and r.text.format is not None
    assert r.text.format.type == "json_schema"


def _not_found(info: pytest.ExceptionInfo[openai.BadRequestError], previous: str) -> None:
    err = info.value
    assert err.status_code == 400
    assert err.code == "previous_response_not_found" and err.param == "previous_response_id"
    assert err.type == "invalid_request_error"
    assert isinstance(err.body, dict)
    assert err.body["message"] == f"Previous response with id '{previous}' not found."


def _conversation(client: openai.OpenAI, instance_of: Any) -> None:
    """Three turns, each sending only its new line: plain, streamed, plain after the stream."""
    first = client.responses.with_raw_response.create(
        model=MODEL,
        instructions=PERSONA,
        input="Do you sell swords?",
        prompt_cache_key=f"player-{uuid.uuid4().hex[:8]}",
        max_output_tokens=8,
    )
    r1 = first.parse()
    assert r1.to_dict()["store"] is True and r1.previous_response_id is None
    second = client.responses.with_raw_response.create(
        model=MODEL, previous_response_id=r1.id, input="How much for steel?", max_output_tokens=8
    )
    r2 = second.parse()
    assert r2.previous_response_id == r1.id and r2.output_text
    assert r1.usage is not None and r2.usage is not None
    # the engine saw the whole conversation (persona, turn one, its answer, the new line) ...
    assert r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens
    # ... on the instance that holds its prefix, the chain's session
    assert instance_of(second) == instance_of(first)
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens // 2
    events = list(
        client.responses.create(
            model=MODEL,
            previous_response_id=r2.id,
            input="Deal.",
            max_output_tokens=4,
            stream=True,
        )
    )
    r3 = events[-1].response  # type: ignore[union-attr]
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert r3.previous_response_id == r2.id and r3.usage is not None
    assert r3.usage.input_tokens > r2.usage.input_tokens
    r4 = client.responses.create(
        model=MODEL, previous_response_id=r3.id, input="Goodbye.", max_output_tokens=4
    )
    assert r4.usage is not None and r4.usage.input_tokens > r3.usage.input_tokens


def _instance(raw: Any) -> str:
    return str(raw.headers["x-warmgate-instance"])


def test_previous_response_id_continues_in_memory(client: openai.OpenAI) -> None:
    _conversation(client, _instance)


def test_store_false_stores_nothing(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Psst.", store=False, max_output_tokens=4)
    assert r.to_dict()["store"] is False
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, previous_response_id=r.id, input="And?")
    _not_found(info, r.id)


def test_unknown_previous_response_id(client: openai.OpenAI, fleet: Fleet) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, previous_response_id="resp_nope", input="Hi")
    _not_found(info, "resp_nope")
    body = {"model": MODEL, "input": "Hi", "previous_response_id": "resp_nope"}
    raw = httpx.post(f"{fleet.base}/v1/responses", json=body, timeout=30)
    assert raw.status_code == 400
    assert set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_openapi_describes_responses(fleet: Fleet) -> None:
    schema = httpx.get(f"{fleet.base}/openapi.json", timeout=30).json()
    op = schema["paths"]["/v1/responses"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"model", "input"} <= set(body["required"])
    assert {"previous_response_id", "store", "instructions"} <= set(body["properties"])
    assert body["additionalProperties"] is False  # any other field is a 400 naming it


class Replica:
    """A second gateway over the first one's config (the same engines and Redis pool)."""

    def __init__(self, fleet: Fleet, **responses: float) -> None:
        config = yaml.safe_load((fleet.tmp / "gateway.yaml").read_text())
        self.port = free_port()
        config["port"] = self.port
        config["responses"] = dict(responses)
        path = fleet.tmp / f"gateway-{self.port}.yaml"
        path.write_text(yaml.safe_dump(config))
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = ManagedProcess(
            python_module("gateway.launch.serve", "--config", str(path)),
            Path(fleet.tmp) / f"gateway-{self.port}.log",
        )
        try:
            self.proc.wait_http(f"{self.base}/livez", timeout_s=60)
        except BaseException:
            self.proc.stop()
            raise

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[tuple[Fleet, Replica, str]]:
    pool = f"responses-{uuid.uuid4().hex[:10]}"
    state = {"backend": "redis", "redis_url": redis_url, "pool": pool}
    f = Fleet(tmp_path_factory.mktemp("gw-responses-redis"), 1, settings={"state": state})
    f.start()
    try:
        replica = Replica(f, ttl_s=0.3)  # what this one stores expires at once
        try:
            yield f, replica, pool
        finally:
            replica.stop()
    finally:
        f.stop()


def _sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def test_previous_response_id_across_replicas_in_redis(
    shared: tuple[Fleet, Replica, str], redis_url: str
) -> None:
    fleet, replica, pool = shared
    with _sdk(fleet.base) as a, _sdk(replica.base) as b:
        r1 = a.responses.create(model=MODEL, instructions=PERSONA, input="Hail!")
        r2 = b.responses.create(model=MODEL, previous_response_id=r1.id, input="Trade?")
        assert r1.usage is not None and r2.usage is not None
        assert r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens
        _conversation(a, _instance)  # the whole chain, stream included, through Redis
    r = redis.Redis.from_url(redis_url)
    try:
        ttl_ms = r.pttl(PoolKeys(pool).response(r1.id))
    finally:
        r.close()
    assert isinstance(ttl_ms, int) and 0 < ttl_ms <= 3_600_000  # bounded: responses.ttl_s


def test_stored_response_expires_after_its_ttl(shared: tuple[Fleet, Replica, str]) -> None:
    fleet, replica, _ = shared
    with _sdk(replica.base) as b, _sdk(fleet.base) as a:
        r = b.responses.create(model=MODEL, input="Quick word.", max_output_tokens=4)

        def expired() -> bool:
            try:
                a.responses.create(model=MODEL, previous_response_id=r.id, input="Still?")
            except openai.BadRequestError as exc:
                return exc.code == "previous_response_not_found"
            return False

        wait_until(expired, timeout_s=30, what=f"{r.id} expired")
