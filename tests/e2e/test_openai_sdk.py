"""The official `openai` SDK against a live gateway in front of three simulated engines:
what a game backend would do, end to end over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from openai import AsyncOpenAI

from tests.e2e.fleet import MODEL, Fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("gw-e2e"), 3).start()
    yield f
    f.stop()


@pytest.fixture
async def client(fleet: Fleet) -> AsyncIterator[AsyncOpenAI]:
    c = AsyncOpenAI(base_url=f"{fleet.base}/v1", api_key="unused", max_retries=0)
    yield c
    await c.close()


HELLO = [{"role": "user", "content": "Hello, innkeeper!"}]


async def test_chat_completion(client: AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content
    assert resp.usage is not None and resp.usage.completion_tokens == 8
    assert resp.usage.prompt_tokens > 0


async def test_streamed_chat_last_chunk_carries_usage(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens_details is not None
    assert all(c.usage is None for c in chunks[:-1])


async def test_streamed_chat_without_usage_gets_none(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=4, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert chunks and all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


async def test_completion(client: AsyncOpenAI) -> None:
    resp = await client.completions.create(model=MODEL, prompt="The old map shows", max_tokens=5)
    assert resp.object == "text_completion"
    assert resp.choices[0].text
    assert resp.usage is not None and resp.usage.completion_tokens == 5


async def test_models(client: AsyncOpenAI) -> None:
    models = [m.id async for m in client.models.list()]
    assert models == [MODEL]


async def test_bad_request_error(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=MODEL, messages=[])
    assert info.value.status_code == 400
    assert info.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=-3)
    assert info.value.param == "max_tokens"


async def test_not_found_error(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="npc-9000", messages=HELLO)
    assert info.value.code == "model_not_found"


async def test_request_id_round_trip(client: AsyncOpenAI) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=HELLO, max_tokens=2, extra_headers={"x-request-id": "npc-req-7"}
    )
    assert raw.headers["x-request-id"] == "npc-req-7"
    completion = raw.parse()
    assert completion._request_id == "npc-req-7"
    generated = await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert generated._request_id and generated._request_id != "npc-req-7"


async def test_players_later_turns_land_on_their_first_instance(
    fleet: Fleet, client: AsyncOpenAI
) -> None:
    world = "World state of Eastvale: the harbor is frozen, the guild is at war. " * 30
    players = {f"player-{p}": f"Player {p} is a level {10 + p} ranger. " * 20 for p in range(4)}
    dialogues: dict[str, list[dict[str, str]]] = {
        key: [{"role": "system", "content": world + state}] for key, state in players.items()
    }
    first: dict[str, str] = {}
    cached: dict[str, list[int]] = {key: [] for key in players}
    for turn in range(4):
        for key, messages in dialogues.items():  # players interleave, as in a live zone
            messages.append({"role": "user", "content": f"{key}, turn {turn}: what news?"})
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=12, prompt_cache_key=key
            )
            instance = raw.headers["x-warmgate-instance"]
            first.setdefault(key, instance)
            assert instance == first[key], f"{key} turn {turn} moved from {first[key]}"
            completion = raw.parse()
            details = completion.usage.prompt_tokens_details if completion.usage else None
            assert details is not None and details.cached_tokens is not None
            cached[key].append(details.cached_tokens)  # what the engine found, not predicted
            reply = completion.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": reply})
    for key, series in cached.items():
        assert series[-1] > 0, f"{key}: the engine served later turns from its cache"
    sessions = fleet.admin("sessions/player-0")
    assert sessions["last_instance"] == first["player-0"]
