#!/usr/bin/env bash
# Scratch (2026-12-07): a copy of the gateway at REV (default HEAD) with timestamps at each phase of a
# proxied request, written by gateway/_phase.py to $PHASE_OUT every 50 requests.
#   bash instrument.sh /tmp/wg-instr [REV] && .venv/bin/python phases.py /tmp/wg-instr 300
set -euo pipefail
OUT="$1"
REV="${2:-HEAD}"
REPO="$(git rev-parse --show-toplevel)"
rm -rf "$OUT" && mkdir -p "$OUT"
git -C "$REPO" archive "$REV" gateway router contracts tierd | tar -x -C "$OUT"
cp "$REPO"/router/*.so "$OUT/router/" 2>/dev/null || true
cat > "$OUT/gateway/_phase.py" <<'PY'
import json, os, time
T = {}
ROWS = []
def mark(name):
    T[name] = time.perf_counter()
def done():
    if "start" in T:
        s = T["start"]
        ROWS.append({k: (v - s) * 1000 for k, v in T.items()})
    T.clear()
    if len(ROWS) % 50 == 0:
        with open(os.environ.get("PHASE_OUT", "/tmp/phases.json"), "w") as f:
            json.dump(ROWS, f)
PY
cd "$OUT" && python3 - <<'PY'
def patch(path, old, new):
    s = open(path).read()
    assert old in s, (path, old)
    open(path, "w").write(s.replace(old, new, 1))
patch("gateway/http/asgi_app.py", "        request = Request(scope, receive, send)\n",
      "        from gateway import _phase\n        _phase.mark('start')\n        request = Request(scope, receive, send)\n")
patch("gateway/http/asgi_app.py", "            return\n        await response(scope, receive, send)\n",
      "            return\n        _phase.mark('response_built')\n        await response(scope, receive, send)\n        _phase.mark('sent')\n        _phase.done()\n")
patch("gateway/http/openai_api.py", "        parse = parse_chat if kind", "        from gateway import _phase; _phase.mark('body_read')\n        parse = parse_chat if kind")
patch("gateway/http/openai_api.py", "        served = await proxy_completion(", "        _phase.mark('parsed')\n        served = await proxy_completion(")
patch("gateway/http/proxy.py", "    routed = await pipeline.decide(parsed, dry_run=False)\n", "    routed = await pipeline.decide(parsed, dry_run=False)\n    from gateway import _phase; _phase.mark('decided')\n")
patch("gateway/http/proxy.py", "    post = state.upstream.post(target, headers, body, head_s)\n", "    from gateway import _phase; _phase.mark('posting')\n    post = state.upstream.post(target, headers, body, head_s)\n")
patch("gateway/http/proxy.py", "    attempt.response = resp\n", "    _phase.mark('head')\n    attempt.response = resp\n")
patch("gateway/upstream/relay.py", "                resp.coalesce(ASSEMBLE_PIECES)\n", "                resp.coalesce(ASSEMBLE_PIECES)\n                from gateway import _phase; _phase.mark('first_token')\n")
patch("gateway/upstream/relay.py", "        relay.flush()\n\n    try:", "        relay.flush()\n        from gateway import _phase; _phase.mark('read_all')\n\n    try:")
PY
