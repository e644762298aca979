// warmgate operator page: polls /admin/ui/state every second and draws it; the explain form
// posts to /admin/route/explain. Everything from the gateway is set as text (session keys
// and reasons are data, never markup).
"use strict";

const POLL_MS = 1000;
const TIER_COLORS = { hbm: "#58a6ff", host: "#a371f7", array: "#3fb950", snapshot: "#d29922",
  reported: "#f0f6fc", predicted: "#58a6ff" };
let model = null;
let failures = 0;

function key() { return sessionStorage.getItem("warmgate-admin-key") || ""; }

async function admin(path, init) {
  const headers = Object.assign({ "content-type": "application/json" }, (init || {}).headers);
  if (key()) headers.authorization = "Bearer " + key();
  const r = await fetch(path, Object.assign({}, init, { headers, cache: "no-store" }));
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    const msg = body && body.error ? body.error.message : r.statusText;
    const err = new Error(r.status + ": " + msg);
    err.status = r.status;
    throw err;
  }
  return body;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmt(n, digits) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  if (typeof n !== "number") return String(n);
  if (digits !== undefined) return n.toFixed(digits);
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return Number.isInteger(n) ? String(n) : n.toFixed(3);
}

function pct(x) {
  if (x === null || x === undefined) return "–";
  const p = 100 * x;
  return (p > 0 && p < 1 ? p.toFixed(2) : p.toFixed(1)) + "%";
}

function bar(frac) {
  const inner = el("span");
  inner.style.width = Math.max(0, Math.min(1, frac || 0)) * 100 + "%";
  return el("span", { class: "bar" }, inner);
}

function banner(text) {
  const b = document.getElementById("banner");
  b.textContent = text || "";
  b.classList.toggle("hidden", !text);
}

function renderFleet(s) {
  const tbody = document.querySelector("#fleet tbody");
  tbody.replaceChildren(...s.instances.map((i) => {
    const fleet = i.fleet ? i.fleet.status : "active";
    const rowClass = "row-" + (fleet === "draining" ? "draining" : i.health.state);
    const e = i.engine || {};
    // a failed scrape says so rather than showing the last figures as if current
    const kv = e.error ? el("span", { class: "unhealthy", title: e.error }, "no answer from /metrics")
      : e.kv_usage === undefined ? el("span", { class: "muted" }, "–")
      : el("span", {}, bar(e.kv_usage), pct(e.kv_usage));
    const b = i.believed_tokens;
    const slices = i.tierd ? (i.tierd.error ? "tierd: " + i.tierd.error
      : Object.entries(i.tierd.slices).map(([t, n]) => t + " " + fmt(n)).join(" · ")) : "no tierd";
    return el("tr", { class: rowClass, "data-instance": i.id, "data-health": i.health.state },
      el("td", {}, i.id),
      el("td", {}, el("span", { class: "pill " + i.health.state }, i.health.state)),
      el("td", { class: "why" }, i.health.reason),
      el("td", { class: fleet }, fleet),
      el("td", { class: "n" }, fmt(i.in_flight)),
      el("td", { class: "n" }, fmt(i.queued_prefill_tokens)),
      el("td", {}, kv),
      el("td", { class: "n" }, e.error || e.running === undefined ? "–" : fmt(e.running) + " / " + fmt(e.waiting)),
      el("td", { class: "n" }, fmt(b.any_tier) + " / " + fmt(b.predicted_hbm)),
      el("td", { class: "muted" }, slices));
  }));
  document.getElementById("arrayline").textContent =
    "shared array: " + fmt(s.array_tokens_believed) + " tokens believed (blocks seen in tierd's array events)";
  const healthy = s.instances.filter((i) => i.health.state === "healthy").length;
  const st = s.stats || {};
  const req = st.requests || {};
  const ttft = st.ttft_s || {};
  const warm = s.warm || {};
  const warmed = Object.values(warm.by_source || {}).reduce((n, o) => n + (o.ok || 0), 0);
  document.getElementById("summary").textContent =
    `${healthy}/${s.instances.length} healthy · policy ${s.policy} · ${s.mode} mode · ` +
    `${fmt(req.total || 0)} requests (${fmt(req.ok || 0)} ok) · TTFT p50 ${fmt(ttft.p50, 3)} s p99 ${fmt(ttft.p99, 3)} s · ` +
    `${fmt(warm.total || 0)} warms (${fmt(warmed)} done)`;
}

// consecutive cumulative samples -> per-interval figures
function intervals(history) {
  const out = [];
  for (let k = 1; k < history.length; k++) {
    const a = history[k - 1], b = history[k];
    const routed = b.routed_prompt_tokens - a.routed_prompt_tokens;
    const prompt = b.prompt_tokens - a.prompt_tokens;
    const tiers = {};
    for (const t of Object.keys(b.predicted_by_tier)) {
      const d = b.predicted_by_tier[t] - (a.predicted_by_tier[t] || 0);
      tiers[t] = routed > 0 ? d / routed : null;
    }
    // the engines' own split by source; a counter that went back (an instance left or
    // restarted) gives no point for that interval
    const engPrompt = Object.values(b.engine_prompt_by_source || {}).reduce((x, y) => x + y, 0)
      - Object.values(a.engine_prompt_by_source || {}).reduce((x, y) => x + y, 0);
    const sources = {};
    for (const src of Object.keys(b.engine_cached_by_source || {})) {
      const d = b.engine_cached_by_source[src] - ((a.engine_cached_by_source || {})[src] || 0);
      const denom = engPrompt > 0 ? engPrompt : prompt;
      sources[src] = d >= 0 && denom > 0 ? d / denom : null;
    }
    out.push({
      t: b.t,
      tiers,
      sources,
      reported: prompt > 0 ? (b.reported_cached - a.reported_cached) / prompt : null,
      predictedTokens: b.predicted_when_reported - a.predicted_when_reported,
      reportedTokens: b.reported_cached - a.reported_cached,
    });
  }
  return out;
}

function lineChart(svgId, legendId, series, yMax, yFormat) {
  const svg = document.getElementById(svgId);
  const W = 560, H = 200, L = 44, R = 8, T = 8, B = 22;
  const ns = "http://www.w3.org/2000/svg";
  const make = (tag, attrs) => {
    const n = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    return n;
  };
  const nodes = [];
  const all = series.flatMap((s) => s.points);
  const t0 = all.length ? Math.min(...all.map((p) => p.t)) : 0;
  const t1 = all.length ? Math.max(...all.map((p) => p.t)) : 1;
  const top = yMax || Math.max(1, ...all.map((p) => p.v));
  const x = (t) => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  for (let g = 0; g <= 4; g++) {
    const v = (top * g) / 4;
    nodes.push(make("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#2a323c" }));
    const label = make("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" });
    label.textContent = yFormat(v);
    nodes.push(label);
  }
  const span = make("text", { x: W - R, y: H - 6, "text-anchor": "end" });
  const secs = Math.round(t1 - t0);
  span.textContent = !all.length ? "waiting for samples…"
    : secs < 120 ? `last ${secs} s` : `last ${Math.round(secs / 60)} min`;
  nodes.push(span);
  for (const s of series) {
    if (!s.points.length) continue;
    const d = s.points.map((p, k) => (k ? "L" : "M") + x(p.t).toFixed(1) + " " + y(p.v).toFixed(1)).join(" ");
    nodes.push(make("path", { d, fill: "none", stroke: s.color, "stroke-width": 2, "data-series": s.name }));
  }
  svg.replaceChildren(...nodes);
  document.getElementById(legendId).replaceChildren(...series.map((s) => {
    const swatch = el("i"); swatch.style.background = s.color;
    const last = s.points.length ? s.points[s.points.length - 1].v : null;
    return el("span", {}, swatch, s.name + " " + (last === null ? "–" : yFormat(last)));
  }));
}

function renderCharts(s) {
  const iv = intervals(s.history);
  const tierNames = ["hbm", "host", "array", "snapshot"].filter((t) => iv.some((p) => p.tiers[t] !== undefined));
  const series = tierNames.map((t) => ({
    name: "predicted " + t, color: TIER_COLORS[t],
    points: iv.filter((p) => p.tiers[t] !== null && p.tiers[t] !== undefined).map((p) => ({ t: p.t, v: p.tiers[t] })),
  }));
  const sourceColors = ["#ff7b72", "#79c0ff", "#d2a8ff", "#56d364"];
  // vLLM publishes every source; draw those that ever hit (else "device" alone)
  let sourceNames = [...new Set(iv.flatMap((p) => Object.keys(p.sources)))];
  const hit = sourceNames.filter((src) => iv.some((p) => p.sources[src] > 0));
  sourceNames = hit.length ? hit : sourceNames.filter((src) => src === "device");
  sourceNames.forEach((src, k) => series.push({
    name: "engines: " + src, color: sourceColors[k % sourceColors.length],
    points: iv.filter((p) => p.sources[src] !== null && p.sources[src] !== undefined).map((p) => ({ t: p.t, v: p.sources[src] })),
  }));
  series.push({ name: "reported by engines (all tiers)", color: TIER_COLORS.reported,
    points: iv.filter((p) => p.reported !== null).map((p) => ({ t: p.t, v: p.reported })) });
  lineChart("hitchart", "hitlegend", series, 1, (v) => Math.round(v * 100) + "%");
  lineChart("cachechart", "cachelegend", [
    { name: "predicted", color: TIER_COLORS.predicted, points: iv.map((p) => ({ t: p.t, v: p.predictedTokens })) },
    { name: "reported", color: TIER_COLORS.reported, points: iv.map((p) => ({ t: p.t, v: p.reportedTokens })) },
  ], null, fmt);
  const c = (s.stats || {}).cached_tokens || {};
  document.getElementById("cachetotals").textContent =
    `since start: predicted ${fmt(c.predicted_on_reported_requests)} vs reported ${fmt(c.reported)} cached tokens ` +
    `on ${fmt(c.requests_with_report)} requests that reported; engines' hit ratio ${pct(c.reported_hit_ratio)}`;
}

function renderHot(s) {
  const row = (r, first) => el("tr", {}, el("td", {}, first), el("td", { class: "n" }, fmt(r.heat, 2)),
    el("td", { class: "n" }, fmt(r.requests)));
  document.querySelector("#sessions tbody").replaceChildren(...s.hot.sessions.map((r) => {
    const tr = row(r, r.key);
    tr.append(el("td", {}, r.last_instance), el("td", { class: "n" }, fmt(r.tokens)),
      el("td", { class: "n" }, fmt(r.seconds_ago, 1)));
    return tr;
  }));
  document.querySelector("#prefixes tbody").replaceChildren(...s.hot.prefixes.map((r) => {
    const tr = row(r, r.key);
    tr.append(el("td", { class: "n" }, fmt(r.sessions)), el("td", {}, r.last_instance),
      el("td", { class: "n" }, fmt(r.seconds_ago, 1)));
    return tr;
  }));
  const first = s.hot.prefixes[0];
  document.getElementById("prefixnote").textContent = first ? `(first ${fmt(first.tokens)} tokens shared)` : "";
}

async function poll() {
  try {
    model = await admin("/admin/ui/state");
    failures = 0;
    banner("");
    document.getElementById("status").className = "pill healthy";
    document.getElementById("status").textContent = "live";
    renderFleet(model);
    renderCharts(model);
    renderHot(model);
    const ta = document.getElementById("explainbody");
    const served = model.instances.flatMap((i) => i.models);
    if (served.length && ta.value.includes('"MODEL"')) ta.value = ta.value.replace('"MODEL"', JSON.stringify(served[0]));
  } catch (err) {
    failures += 1;
    document.getElementById("status").className = "pill unhealthy";
    document.getElementById("status").textContent = "not updating";
    banner(err.status === 401 || err.status === 403
      ? "The admin API refused: enter an admin key above (" + err.message + ")."
      : "The gateway is not answering (" + err.message + "); retrying.");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function renderExplain(x) {
  const out = document.getElementById("explainout");
  const d = x.decision, r = x.request;
  const cands = x.candidates || [];
  const parts = [...new Set(cands.flatMap((c) => Object.keys(c.parts || {})))];
  const terms = [...new Set(cands.flatMap((c) => Object.keys(c.score_terms || {})))].filter((t) => t !== "predicted_ttft_s");
  const head = el("tr", {}, ...["instance", "in flight", "cached by tier", "predicted TTFT s", ...parts, ...terms].map((h) => el("th", {}, h)));
  const rows = cands.map((c) => el("tr", { class: c.instance === d.instance ? "chosen" : "" },
    el("td", {}, (c.instance === d.instance ? "▶ " : "") + c.instance),
    el("td", { class: "n" }, fmt(c.in_flight)),
    el("td", {}, Object.entries(c.cached_tokens_by_tier || {}).map(([t, n]) => t + " " + n).join(" · ") || "none"),
    el("td", { class: "n" }, fmt(c.predicted_ttft_s, 4)),
    ...parts.map((p) => el("td", { class: "n" }, fmt((c.parts || {})[p], 4))),
    ...terms.map((t) => el("td", { class: "n" }, fmt((c.score_terms || {})[t], 4)))));
  const table = el("table", { id: "explaintable" }, el("thead", {}, head), el("tbody", {}, ...rows));
  const excluded = Object.entries(x.excluded || {}).map(([id, h]) => id + " (" + h.state + ": " + h.reason + ")").join("; ");
  out.replaceChildren(...[
    el("p", {}, `${r.model} · session ${r.session_key || "none"} · ${r.prompt_tokens} prompt tokens · ${r.blocks} blocks of ${r.block_tokens} (${r.mode})`),
    el("p", {}, el("strong", {}, "→ " + d.instance), ` by ${d.policy}: ${d.reason}; fallbacks ${d.fallbacks.join(", ") || "none"}`),
    table,
    excluded ? el("p", { class: "muted" }, "not candidates: " + excluded) : null,
  ].filter((n) => n !== null));
}

document.getElementById("explainform").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const out = document.getElementById("explainout");
  let body;
  try { body = JSON.parse(document.getElementById("explainbody").value); } catch (e) {
    out.replaceChildren(el("p", { class: "unhealthy" }, "not JSON: " + e.message)); return;
  }
  try {
    renderExplain(await admin("/admin/route/explain", { method: "POST", body: JSON.stringify(body) }));
  } catch (err) {
    out.replaceChildren(el("p", { class: "unhealthy" }, err.message));
  }
});

document.getElementById("keyform").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("warmgate-admin-key", document.getElementById("key").value);
  document.getElementById("key").value = "";
});

poll();
