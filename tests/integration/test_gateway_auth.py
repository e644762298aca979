"""API keys: with `api_keys` configured, the OpenAI and admin APIs need one (the SDK raises
AuthenticationError otherwise); probes and metrics stay open."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, Fleet

KEY = "sk-warmgate-test-key"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("gw-auth"), 1, settings={"api_keys": ["other-key", KEY]})
    f.start()
    yield f
    f.stop()


def test_sdk_with_the_key_is_served_and_without_it_refused(fleet: Fleet) -> None:
    good = openai.OpenAI(base_url=f"{fleet.base}/v1", api_key=KEY, max_retries=0)
    resp = good.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=3
    )
    assert resp.choices[0].message.content
    assert [m.id for m in good.models.list()] == [MODEL]
    bad = openai.OpenAI(base_url=f"{fleet.base}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert info.value.code == "invalid_api_key"
    good.close()
    bad.close()


def test_admin_needs_a_key_and_probes_do_not(fleet: Fleet) -> None:
    r = httpx.get(f"{fleet.base}/admin/stats")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"
    ok = httpx.get(f"{fleet.base}/admin/stats", headers={"authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200
    for path in ("/livez", "/readyz", "/metrics"):
        assert httpx.get(f"{fleet.base}{path}").status_code == 200
