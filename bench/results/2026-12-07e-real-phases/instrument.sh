#!/usr/bin/env bash
# Scratch: a copy of the gateway at REV with per-request phase stamps (contextvar), one JSON line a
# request to $PHASE_OUT at its second relayed write.
set -euo pipefail
OUT="$1"; REV="${2:-HEAD}"; REPO=/work/main
rm -rf "$OUT" && mkdir -p "$OUT"
git -C "$REPO" archive "$REV" gateway router contracts tierd | tar -x -C "$OUT"
cp "$REPO"/router/*.so "$OUT/router/" 2>/dev/null || true
cp "$REPO"/tierd/native/*.so "$OUT/tierd/native/" 2>/dev/null || true
cat > "$OUT/gateway/_phase.py" <<'PY'
import contextvars, json, os, time
CUR = contextvars.ContextVar("phase", default=None)
def begin():
    CUR.set({"start": time.perf_counter(), "cpu0": time.thread_time(), "n": 0})
def mark(name):
    d = CUR.get()
    if d is not None and name not in d:
        d[name] = time.perf_counter()
        if name == "posting":
            d["cpu_posting"] = time.thread_time()
def write_out(nbytes):
    d = CUR.get()
    if d is None:
        return
    d["n"] += 1
    d[f"w{d['n']}"] = time.perf_counter()
    d[f"b{d['n']}"] = nbytes
    if d["n"] == 3:
        s = d["start"]
        row = {k: ((v - s) * 1000 if not k.startswith(("b", "n", "cpu")) else v) for k, v in d.items()}
        with open(os.environ.get("PHASE_OUT", "/tmp/phases.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
PY
cd "$OUT" && python3 - <<'PY'
def patch(path, old, new):
    s = open(path).read()
    assert old in s, (path, old)
    open(path, "w").write(s.replace(old, new, 1))
patch("gateway/http/asgi_app.py", "        request = Request(scope, receive, send)\n",
      "        from gateway import _phase\n        _phase.begin()\n        request = Request(scope, receive, send)\n")
patch("gateway/http/openai_api.py", "        limits = settings.request_limits\n", "        from gateway import _phase; _phase.mark('read')\n        limits = settings.request_limits\n")
patch("gateway/http/openai_api.py", "        parse = parse_chat if kind", "        _phase.mark('decoded')\n        parse = parse_chat if kind")
patch("gateway/http/openai_api.py", "        await enforce(state.limits, request, parsed)\n", "        _phase.mark('parse_only')\n        await enforce(state.limits, request, parsed)\n")
patch("router/precise.py", "    return RouteRequest(\n        model=model,\n        block_hashes", "    from gateway import _phase; _phase.mark('hashed')\n    return RouteRequest(\n        model=model,\n        block_hashes")
patch("gateway/pipeline/decide.py", "        bound = await bindings.lookup(rr, dry_run=dry_run) if bindings is not None else None\n", "        from gateway import _phase; _phase.mark('rr')\n        bound = await bindings.lookup(rr, dry_run=dry_run) if bindings is not None else None\n        _phase.mark('bound')\n")
patch("gateway/pipeline/decide.py", "        decision, binding = chosen, None\n", "        _phase.mark('routed')\n        decision, binding = chosen, None\n")
patch("gateway/http/openai_api.py", "        served = await proxy_completion(", "        _phase.mark('parsed')\n        served = await proxy_completion(")
patch("gateway/pipeline/tokens.py", "            return await precise_route_request(", "            from gateway import _phase; _phase.mark('tok_start')\n            return await precise_route_request(")
patch("gateway/pipeline/hf_tokenizer.py", "        parts, known, missing = self.segments.split(text)\n", "        from gateway import _phase; _phase.mark('rendered')\n        parts, known, missing = self.segments.split(text)\n")
patch("gateway/pipeline/hf_tokenizer.py", "        return self.segments.join(parts, known, encoded)", "        _phase.mark('encoded')\n        return self.segments.join(parts, known, encoded)")
patch("gateway/http/proxy.py", "    routed = await pipeline.decide(parsed, dry_run=False)\n", "    routed = await pipeline.decide(parsed, dry_run=False)\n    from gateway import _phase; _phase.mark('decided')\n")
patch("gateway/http/proxy.py", "    post = state.upstream.post(target, headers, body, head_s)\n", "    from gateway import _phase; _phase.mark('posting')\n    post = state.upstream.post(target, headers, body, head_s)\n")
patch("gateway/http/proxy.py", "    attempt.response = resp\n", "    _phase.mark('head')\n    attempt.response = resp\n")
patch("gateway/upstream/relay.py", "                    if out := b\"\".join(self._out(life.inspect(self.instance, self.relay, pending))):\n                        yield out\n",
      "                    from gateway import _phase; _phase.mark('relay_first')\n                    if out := b\"\".join(self._out(life.inspect(self.instance, self.relay, pending))):\n                        yield out\n")
patch("gateway/http/listener.py", "    def write(self, data: bytes) -> None:\n        held, self._held = self._held, None\n", "    def write(self, data: bytes) -> None:\n        from gateway import _phase; _phase.write_out(len(data))\n        held, self._held = self._held, None\n")
PY
echo instrumented
