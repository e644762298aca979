"""Roles: client keys reach the OpenAI API, admin keys reach everything; `/admin/*` answers
401 without a key, 403 to a client key, 200 to an admin key (given as is or hashed); probes
and metrics stay open. Without admin keys the admin API is served only on the admin
listener (loopback), never beside a public bind."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, Fleet
from tests.support.procs import free_port

KEY = "sk-warmgate-test-key"
ADMIN = "sk-warmgate-admin"
HASHED_ADMIN = "sk-warmgate-admin-hashed"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    digest = "sha256:" + hashlib.sha256(HASHED_ADMIN.encode()).hexdigest()
    f = Fleet(
        tmp_path_factory.mktemp("gw-auth"),
        1,
        settings={"api_keys": ["other-key", KEY], "auth": {"admin_keys": [ADMIN, digest]}},
    )
    f.start()
    yield f
    f.stop()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


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
    admin = openai.OpenAI(base_url=f"{fleet.base}/v1", api_key=ADMIN, max_retries=0)
    assert [m.id for m in admin.models.list()] == [MODEL]  # admin keys reach everything
    for c in (good, bad, admin):
        c.close()


@pytest.mark.parametrize("path", ["stats", "instances", "sessions/some-player", "route/explain"])
def test_admin_api_is_401_without_key_403_for_clients_200_for_admins(
    fleet: Fleet, path: str
) -> None:
    url = f"{fleet.base}/admin/{path}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    method = "POST" if path == "route/explain" else "GET"
    r = httpx.request(method, url, json=body)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"
    r = httpx.request(method, url, json=body, headers=bearer("sk-nobody"))
    assert r.status_code == 401
    r = httpx.request(method, url, json=body, headers=bearer(KEY))
    assert r.status_code == 403
    assert r.json()["error"]["type"] == "permission_error"
    for key in (ADMIN, HASHED_ADMIN):
        r = httpx.request(method, url, json=body, headers=bearer(key))
        assert r.status_code in (200, 404), r.text  # 404: a session nobody played
        assert "error" not in r.json() or path.startswith("sessions")


def test_probes_and_schema_stay_open_and_keys_are_never_logged(fleet: Fleet) -> None:
    for path in ("/livez", "/readyz", "/metrics", "/openapi.json"):
        assert httpx.get(f"{fleet.base}{path}").status_code == 200
    assert fleet.gateway is not None
    log = fleet.gateway.log_path.read_text(errors="replace")
    assert KEY not in log and ADMIN not in log and HASHED_ADMIN not in log


def test_public_bind_without_admin_keys_serves_admin_only_on_loopback_admin_port(
    tmp_path: Path,
) -> None:
    admin_port = free_port()
    f = Fleet(
        tmp_path,
        1,
        settings={"host": "0.0.0.0", "auth": {"admin_port": admin_port}},
    )
    f.start()
    try:
        r = httpx.get(f"{f.base}/admin/stats")
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "admin_not_served_here"
        assert httpx.get(f"http://127.0.0.1:{admin_port}/admin/stats").status_code == 200
        assert httpx.get(f"{f.base}/v1/models").status_code == 200
        assert f.gateway is not None
        assert "admin API is not served" in f.gateway.log_path.read_text()
    finally:
        f.stop()
