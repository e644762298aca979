"""`POST /v1/responses` with the official OpenAI SDK against a gateway in front of simulated
engines: plain, instructions plus message items, streamed (the typed events in order), and
the 400 naming a field the gateway cannot serve."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, Fleet


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
    text = "".join(d.delta for d in deltas)  # type: ignore[union-attr]
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == text and text
    assert done.usage is not None and 0 < done.usage.output_tokens <= 6


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
        ({"previous_response_id": "resp_x"}, "previous_response_id"),
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
    assert r.output_text and r.store is False
    assert r.text is not None and r.text.format is not None
    assert r.text.format.type == "json_schema"
