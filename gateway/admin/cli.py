"""`warmgate admin`: the admin REST from a shell. Human tables by default, `--json` for the
answer as the gateway gave it. The gateway is `--url` (env `WARMGATE_URL`, default
http://127.0.0.1:8000); the admin key is `--admin-key` (env `WARMGATE_ADMIN_KEY`), sent as
`Authorization: Bearer`.

    warmgate admin instances
    warmgate admin stats
    warmgate admin sessions PLAYER
    warmgate admin explain request.json        (a completion request body; - for stdin)
    warmgate admin add ID URL [--tierd-url U] [--model M ...] [--kv-events-endpoint E]
    warmgate admin drain ID [--wait [--timeout S]]
    warmgate admin remove ID
    warmgate admin fleet
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from contracts.errors import AdminError
from gateway.admin.tables import (
    explain_tables,
    fleet_table,
    instances_table,
    kv_table,
)


class AdminCliError(AdminError):
    """The gateway refused, or could not be reached."""


class AdminClient:
    def __init__(self, url: str, key: str | None, timeout_s: float) -> None:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout_s, trust_env=False
        )

    def call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            r = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise AdminCliError(
                f"{self._http.base_url}{path}: {type(exc).__name__}: {exc}"
            ) from None
        try:
            data = r.json()
        except ValueError:
            data = {"error": {"message": r.text[:500]}}
        if r.status_code >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            message = err.get("message") if isinstance(err, dict) else None
            raise AdminCliError(f"{r.status_code}: {message or r.text[:500]}", data)
        return data

    def close(self) -> None:
        self._http.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="warmgate admin", description=__doc__.split("\n\n")[0])
    _global_flags(p, url=os.environ.get("WARMGATE_URL", "http://127.0.0.1:8000"))
    # the same flags after the subcommand too (`warmgate admin instances --json`); there they
    # default to SUPPRESS, so one not given keeps the value (or default) from before it
    common = argparse.ArgumentParser(add_help=False)
    _global_flags(common, url=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    command("instances", "each instance: health and why, load, cached tokens")
    command("stats", "requests by outcome, cached tokens, TTFT percentiles")
    s = command("sessions", "where a player's KV is believed to be")
    s.add_argument("key")
    s = command("explain", "dry-run routing of a request body (JSON file, - stdin)")
    s.add_argument("file")
    s.add_argument("--session", help="X-Session-Id to send with it")
    s = command("add", "add an instance (validated by the gateway)")
    s.add_argument("id")
    s.add_argument("instance_url", metavar="url", help="the engine's base URL (no /v1)")
    s.add_argument("--tierd-url")
    s.add_argument("--model", action="append", default=[], dest="models")
    s.add_argument("--kv-events-endpoint")
    s.add_argument("--engine", help="its engine kind (instances[].engine; default vllm)")
    s = command("drain", "stop new requests to an instance; it leaves when idle")
    s.add_argument("id")
    s.add_argument("--wait", action="store_true", help="return once it has left the fleet")
    s.add_argument("--wait-timeout", type=float, default=600.0)
    s = command("remove", "take an instance out of the fleet now")
    s.add_argument("id")
    command("fleet", "runtime fleet changes on record, drains in progress")
    return p


def _global_flags(p: argparse.ArgumentParser, *, url: str) -> None:
    """--url, --admin-key, --json, --timeout; `url` is the default of --url, and SUPPRESS
    makes every one of them keep the value parsed before (the subcommands' copy)."""
    suppress = url is argparse.SUPPRESS
    p.add_argument("--url", dest="gateway", default=url, help="the gateway (env WARMGATE_URL)")
    p.add_argument(
        "--admin-key",
        default=argparse.SUPPRESS if suppress else os.environ.get("WARMGATE_ADMIN_KEY"),
        help="admin key (env WARMGATE_ADMIN_KEY)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="print the gateway's JSON answer",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS if suppress else 30.0,
        help="seconds per HTTP call",
    )


def _read_body(path: str) -> Any:
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
    try:
        return json.loads(text)
    except ValueError as exc:
        raise AdminCliError(f"{path}: not JSON: {exc}") from None


def _wait_gone(client: AdminClient, instance: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        fleet = client.call("GET", "/admin/fleet")
        if instance not in fleet.get("instances", []):
            return {"id": instance, "status": "removed", "drained": True}
        if time.monotonic() > deadline:
            left = fleet.get("draining", {}).get(instance, {}).get("in_flight")
            raise AdminCliError(f"{instance} still draining after {timeout_s}s ({left} in flight)")
        time.sleep(0.5)


def run(args: argparse.Namespace, client: AdminClient) -> tuple[Any, Callable[[Any], str]]:
    """The gateway's answer to the command, and how to print it for people."""
    c = args.command
    if c == "instances":
        return client.call("GET", "/admin/instances"), instances_table
    if c == "stats":
        return client.call("GET", "/admin/stats"), kv_table
    if c == "sessions":
        return client.call("GET", f"/admin/sessions/{args.key}"), kv_table
    if c == "explain":
        body = _read_body(args.file)
        if args.session:
            body.setdefault("user", args.session)
        return client.call("POST", "/admin/route/explain", body), explain_tables
    if c == "add":
        spec: dict[str, Any] = {"id": args.id, "url": args.instance_url}
        if args.tierd_url:
            spec["tierd_url"] = args.tierd_url
        if args.models:
            spec["models"] = args.models
        if args.kv_events_endpoint:
            spec["kv_events_endpoint"] = args.kv_events_endpoint
        if args.engine:
            spec["engine"] = args.engine
        return client.call("POST", "/admin/instances", spec), kv_table
    if c == "drain":
        answer = client.call("POST", f"/admin/instances/{args.id}/drain")
        if args.wait:
            answer = {**answer, **_wait_gone(client, args.id, args.wait_timeout)}
        return answer, kv_table
    if c == "remove":
        return client.call("DELETE", f"/admin/instances/{args.id}"), kv_table
    if c == "fleet":
        return client.call("GET", "/admin/fleet"), fleet_table
    raise AdminCliError(f"unknown command {c}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    client = AdminClient(args.gateway, args.admin_key, args.timeout)
    try:
        answer, human = run(args, client)
    except AdminCliError as exc:
        detail = exc.args[1] if len(exc.args) > 1 else None
        if args.json and detail is not None:
            print(json.dumps(detail, indent=2))
        else:
            print(f"warmgate admin {args.command}: {exc.args[0]}", file=sys.stderr)
            checks = detail.get("checks") if isinstance(detail, dict) else None
            for check in checks or []:
                mark = "ok  " if check.get("ok") else "FAIL"
                print(f"  {mark} {check.get('name')}: {check.get('detail')}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(json.dumps(answer, indent=2) if args.json else human(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
