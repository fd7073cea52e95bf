// probe ui: renders the snapshot that `probe ui` caches (one fan-out per refresh) as tiles,
// SVG charts drawn here (no charting library: a few polylines and rects), the diagnose/
// verdicts as banners, grouped stacks and a SQL console. No network access but this server.
"use strict";
const REFRESH_MS = 1500;
const STATES = { training: "training", waiting: "waiting in a collective", hung: "hung",
                 gil: "GIL held", dead: "dead" };
const SHORT = { training: "training", waiting: "waiting", hung: "hung", gil: "GIL held", dead: "dead" };
const NS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
// Every data request carries the page's own key (probe_cli/ui/server.py, 4): the cookie alone
// is sent by any page of the same site, another port of 127.0.0.1 included.
const KEY = { "X-Probe-UI-Key": document.querySelector('meta[name="probe-ui-key"]').content };
const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
// Findings write commands in backticks (`probe trace on`): shown as code, not as backticks.
const rich = (s) => esc(s).replace(/`([^`\n]+)`/g, "<code>$1</code>");
const fmtMs = (s) => (s == null ? "–" : s < 1 ? (s * 1e3).toFixed(s < 0.01 ? 1 : 0) + " ms" : s.toFixed(2) + " s");
const openStacks = new Set();

function median(xs) { const s = [...xs].sort((a, b) => a - b); const n = s.length;
  return n ? (n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2) : 0; }

function renderLegend() {
  $("legend").innerHTML = Object.entries(STATES).map(([k, v]) =>
    `<span class="key tile ${k}"></span>${esc(v)}`).join("");
}

function renderTiles(tiles) {
  const byHost = new Map();
  for (const t of tiles) { if (!byHost.has(t.host)) byHost.set(t.host, []); byHost.get(t.host).push(t); }
  const dense = tiles.length > 64;  // at 512 ranks a tile is a coloured cell, details on hover
  let html = "";
  for (const [host, ts] of byHost) {
    const counts = {};
    for (const t of ts) counts[t.state] = (counts[t.state] || 0) + 1;
    const sum = Object.entries(counts).map(([k, n]) => `${n} ${STATES[k] || k}`).join(", ");
    html += `<div class="node"><h3>${esc(host)} · ${ts.length} rank${ts.length > 1 ? "s" : ""} · ${esc(sum)}</h3>`
         + `<div class="grid${dense ? " dense" : ""}">`;
    for (const t of ts) {
      const title = `rank ${t.rank} on ${t.host}: ${STATES[t.state] || t.state}; step ${t.step ?? "–"}; `
        + `last step ${fmtMs(t.step_time)}; ${t.since ?? "–"} s since${t.error ? "; " + t.error : ""}`;
      html += dense
        ? `<div class="tile ${t.state}" data-rank="${t.rank}" title="${esc(title)}">${t.rank}</div>`
        : `<div class="tile ${t.state}" data-rank="${t.rank}" title="${esc(title)}"><b>rank ${t.rank}</b>`
          + `<br>step <span class="step">${t.step ?? "–"}</span><br>${fmtMs(t.step_time)}`
          + `<br>${t.since == null ? "–" : t.since + " s ago"}<br>${esc(SHORT[t.state] || t.state)}</div>`;
    }
    html += "</div></div>";
  }
  $("ranks").innerHTML = html || "<p>no rank answered yet</p>";
}

function svg(w, h) { const s = document.createElementNS(NS, "svg");
  s.setAttribute("viewBox", `0 0 ${w} ${h}`); s.setAttribute("width", "100%"); return s; }
function el(tag, attrs, parent) { const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); parent.appendChild(e); return e; }
const palette = (i, n) => `hsl(${Math.round((360 * i) / Math.max(n, 1))},60%,62%)`;

// The steps every rank's series covers: from the latest first step of any rank on. Each rank
// sends its own last steps; drawn as they came, one rank's line started where another's had
// none (the charts of two ranks covered different step ranges).
function commonFrom(tiles, key) {
  const firsts = tiles.map((t) => (t.series || []).filter((p) => p.step != null && (key == null || p[key] != null))
    .reduce((m, p) => Math.min(m, p.step), Infinity)).filter((x) => x !== Infinity);
  return firsts.length ? Math.max(...firsts) : -Infinity;
}

// One line per rank over steps; points above median + 4·MAD of all points are marked outliers.
function lineChart(target, tiles, key, unit, fmt, markOutliers) {
  const W = 520, H = 180, L = 52, B = 18;
  const pts = [];
  const from = commonFrom(tiles, key);
  tiles.forEach((t, i) => (t.series || []).forEach((p) => {
    if (p[key] != null && p.step != null && p.step >= from) pts.push({ i, rank: t.rank, x: p.step, y: p[key] }); }));
  const box = $(target); box.innerHTML = "";
  if (!pts.length) { box.textContent = "no steps recorded yet"; return; }
  const xs = pts.map((p) => p.x), ys = pts.map((p) => p.y);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y1 = Math.max(...ys) * 1.1 || 1;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - 6), Y = (y) => H - B - (y / y1) * (H - B - 6);
  const s = svg(W, H);
  el("line", { x1: L, y1: H - B, x2: W, y2: H - B, class: "axis" }, s);
  el("line", { x1: L, y1: 0, x2: L, y2: H - B, class: "axis" }, s);
  el("text", { x: 2, y: 12 }, s).textContent = fmt(y1);
  el("text", { x: 2, y: H - B }, s).textContent = "0 " + unit;
  el("text", { x: L, y: H - 4 }, s).textContent = "step " + x0;
  el("text", { x: W - 2, y: H - 4, "text-anchor": "end" }, s).textContent = "step " + x1;
  const n = tiles.length;
  tiles.forEach((t, i) => {
    const mine = pts.filter((p) => p.i === i).sort((a, b) => a.x - b.x);
    if (mine.length > 1) el("polyline", { points: mine.map((p) => `${X(p.x).toFixed(1)},${Y(p.y).toFixed(1)}`).join(" "),
      fill: "none", stroke: palette(i, n), "stroke-width": n > 64 ? 0.6 : 1.4 }, s);
  });
  if (markOutliers) {
    const m = median(ys), mad = median(ys.map((y) => Math.abs(y - m))) || m * 0.05;
    for (const p of pts) if (p.y > m + 4 * mad && p.y > m * 1.2) {
      const c = el("circle", { cx: X(p.x), cy: Y(p.y), r: 3, fill: "#d64545", class: "outlier" }, s);
      el("title", {}, c).textContent = `rank ${p.rank} step ${p.x}: ${fmt(p.y)} (median ${fmt(m)})`;
    }
  }
  box.appendChild(s);
  if (n <= 16) {  // a colour key while it stays readable; hover a point or line otherwise
    const key = document.createElement("div");
    key.className = "ranks-key";
    key.innerHTML = tiles.map((t, i) => `<svg width="18" height="8"><line x1="0" y1="4" x2="18" y2="4" stroke="${palette(i, n)}" stroke-width="2"/></svg> rank ${esc(t.rank)}`).join(" ");
    box.appendChild(key);
  }
}

// The loss chart's marks: the agent's spikes (orange) and non-finite steps (red, on the axis:
// a NaN has no height). Positions use the same scale lineChart drew with.
function markLoss(target, tiles) {
  const s = $(target).querySelector("svg");
  if (!s) return;
  const W = 520, H = 180, L = 52, B = 18;
  const pts = [];
  const from = commonFrom(tiles, "loss");
  tiles.forEach((t) => (t.series || []).forEach((p) => { if (p.step != null && p.step >= from) pts.push({ rank: t.rank, p }); }));
  const ys = pts.map((q) => q.p.loss).filter((y) => typeof y === "number");
  if (!pts.length) return;
  const xs = pts.map((q) => q.p.step);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y1 = (ys.length ? Math.max(...ys) : 1) * 1.1 || 1;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - 6), Y = (y) => H - B - (y / y1) * (H - B - 6);
  for (const { rank, p } of pts) {
    if (p.nonfinite) {
      const c = el("rect", { x: X(p.step) - 2, y: H - B - 6, width: 4, height: 6, fill: "#d64545", class: "nonfinite" }, s);
      el("title", {}, c).textContent = `rank ${rank} step ${p.step}: loss or gradients NaN/Inf`;
    } else if (p.spike && typeof p.loss === "number") {
      const c = el("circle", { cx: X(p.step), cy: Y(p.loss), r: 3.5, fill: "#e08a1e", class: "spike" }, s);
      el("title", {}, c).textContent = `rank ${rank} step ${p.step}: loss ${p.loss.toPrecision(4)}, x${p.spike} its recent median`;
    }
  }
}

function renderHeatmap(slow, at) {
  const box = $("heatmap"); box.innerHTML = "";
  const ranks = Object.keys(slow || {}).map(Number).sort((a, b) => a - b);
  const total = new Map();
  for (const r of ranks) for (const row of slow[r]) total.set(row.module, (total.get(row.module) || 0) + (row.self_ms || 0));
  const mods = [...total.entries()].sort((a, b) => b[1] - a[1]).slice(0, 12).map((e) => e[0]);
  $("slow-at").textContent = at ? `(every few refreshes; ${new Date(at * 1000).toLocaleTimeString()})` : "";
  if (!mods.length) { box.innerHTML = rich("no traced steps yet (`probe trace on` traces every step)"); return; }
  // a label is rotated up to the right: the last one needs room past its column (it was cut)
  const cell = ranks.length > 64 ? 3 : 16, L = 60, T = 110, CW = 72, R = 100;
  const s = svg(L + CW * mods.length + R, T + cell * ranks.length + 4);
  s.setAttribute("width", L + CW * mods.length + R);
  const max = Math.max(...ranks.flatMap((r) => slow[r].map((x) => x.self_ms || 0)), 1e-9);
  mods.forEach((m, j) => { const t = el("text", { x: L + CW * j + 8, y: T - 4, transform: `rotate(-35 ${L + CW * j + 8} ${T - 4})` }, s);
    t.textContent = m.length > 22 ? "…" + m.slice(-21) : m;
    el("title", {}, t).textContent = m; });
  ranks.forEach((r, i) => {
    if (cell >= 10 || i % 32 === 0) el("text", { x: 2, y: T + cell * i + Math.min(cell, 12) }, s).textContent = "rank " + r;
    const byMod = new Map(slow[r].map((x) => [x.module, x.self_ms]));
    mods.forEach((m, j) => {
      const v = byMod.get(m) || 0, a = v / max;
      const rect = el("rect", { x: L + CW * j, y: T + cell * i, width: CW - 2, height: Math.max(cell - 1, 1),
        fill: `rgb(${Math.round(30 + 220 * a)},${Math.round(60 + 60 * (1 - a))},${Math.round(120 * (1 - a))})` }, s);
      el("title", {}, rect).textContent = `rank ${r} · ${m}: ${v} ms self per step`;
    });
  });
  box.appendChild(s);
}

const CHECKING = '<div class="banner checking" id="banner-checking">Checking the job\u2026 (no answer from the ranks yet)</div>';

// Verdict headlines already lead with their label ("HANG: rank 1 …"); add one only if not.
const label = (word, text) => (/^[A-Z][A-Z /]+:/.test(text || "") ? text : `${word}: ${text}`);

function banners(v, staleS) {
  const out = [];
  const hang = v.hang;
  if (!hang) {  // no snapshot yet: say nothing about the job's health before the first answer
    // (nor from an old one: the server withholds a snapshot nobody refreshed for a while)
    $("banners").innerHTML = staleS == null ? CHECKING
      : CHECKING.replace("(no answer from the ranks yet)", `(the last answer is ${Math.round(staleS)} s old; asking again)`);
    return;
  }
  if (hang && hang.problem) out.push(`<div class="banner hang" id="banner-hang">${rich(label("HANG", hang.headline))}<a href="#ev-hang">evidence</a></div>`);
  const st = v.straggler;
  // A straggler is not news while the job hangs: its arrivals are from before the hang.
  if (st && st.problem && !hang.problem) out.push(`<div class="banner straggler" id="banner-straggler">${rich(label("STRAGGLER", st.headline))}<a href="#ev-straggler">evidence</a></div>`);
  // "no straggler" only when the straggler round said so: a round without a verdict (too few
  // collectives) is not a clean bill, and the banner said "no straggler" above "no verdict"
  const stOk = st && !st.problem && /^no straggler/i.test(st.headline || "");
  const stWord = !st ? "" : stOk ? ", no straggler" : !st.problem ? ", no straggler verdict yet" : "";
  const doc = v.doctor;
  (doc && doc.findings || []).filter((f) => f.severity !== "info" && f.check !== "hang" && f.check !== "straggler")
    .forEach((f, i) => out.push(`<div class="banner ${esc(f.severity)}">${rich(label("DOCTOR", f.title))}<a href="#ev-doctor-${i}">evidence</a></div>`));
  if (!out.length) out.push(`<div class="banner ok">No hang${stWord}${doc ? ", doctor finds nothing wrong" : ""}.</div>`);
  $("banners").innerHTML = out.join("");
  let ev = "";
  const block = (id, title, lines, next) => `<details id="${id}" open><summary>${rich(title)}</summary><pre>${rich((lines || []).join("\n"))}${next ? "\nnext: " + rich(next) : ""}</pre></details>`;
  // a verdict's label in capitals only when it found one ("STRAGGLER: no verdict" read as one)
  const named = (word, v) => (v.problem ? label(word, v.headline) : `${word.toLowerCase()}: ${v.headline}`);
  if (hang) ev += block("ev-hang", named("HANG", hang), hang.details, "probe hang");
  if (st) ev += block("ev-straggler", named("STRAGGLER", st), st.details, "probe straggler");
  (doc && doc.findings || []).filter((f) => f.severity !== "info" && f.check !== "hang" && f.check !== "straggler")
    .forEach((f, i) => { ev += block(`ev-doctor-${i}`, `${f.severity}: ${f.title}`, f.evidence, f.next); });
  (doc && doc.findings || []).filter((f) => f.severity === "info").forEach((f) => {
    ev += `<details><summary><span class="sev info">info</span>${rich(f.title)}</summary><pre>${rich((f.evidence || []).join("\n"))}${f.next ? "\nnext: " + rich(f.next) : ""}</pre></details>`; });
  $("findings").innerHTML = ev || "waiting for the first doctor round…";
  const leak = (doc && doc.findings || []).find((f) => f.check === "memory");
  $("leak").textContent = leak ? leak.title : "";
}

const KINDS = [["parameters", "#4e79a7"], ["gradients", "#f28e2b"], ["optimizer", "#e15759"],
  ["activations", "#76b7b2"], ["other", "#bab0ac"]];

// One stacked bar per rank (doctor's memory_use finding: the breakdown of every rank), scaled to
// the largest total (or device capacity, drawn as the bar's frame on CUDA).
// The server's CSP (style-src 'self') drops style attributes in markup, which left every
// stacked bar an empty frame: sizes and colours travel as data-w (a width in %) and data-c (a
// colour) and are set here through the CSSOM, which the policy allows.
function applyStyles(root) {
  for (const el of root.querySelectorAll("[data-w], [data-c]")) {
    if (el.dataset.w) el.style.width = el.dataset.w + "%";
    if (el.dataset.c) el.style.background = el.dataset.c;
  }
}

function renderMemKinds(doc) {
  const f = (doc && doc.findings || []).find((x) => x.check === "memory_use");
  const bds = ((f && f.detail && f.detail.breakdown) || []).slice().sort((a, b) => a.rank - b.rank);
  if (!doc) return;
  if (!bds.length) { $("memkinds").textContent = "no traced step counted yet (memory by kind is taken on traced steps: probe trace every 10)"; return; }
  const scale = Math.max(...bds.map((b) => Math.max(b.total_mib || 0, b.capacity_mib || 0))) || 1;
  const mib = (v) => (v >= 1024 ? (v / 1024).toFixed(1) + " GiB" : v >= 1 ? v.toFixed(1) + " MiB" : (v * 1024).toFixed(0) + " KiB");
  const legend = KINDS.map(([k, c]) => `<span class="kind"><i data-c="${c}"></i>${k}</span>`).join(" ");
  $("memkinds").innerHTML = `<div class="kinds-legend">${legend}</div>` + bds.map((b) => {
    const segs = KINDS.map(([k, c]) => { const v = b[k + "_mib"] || 0;
      return `<span class="seg" data-kind="${k}" data-w="${(100 * v / scale).toFixed(3)}" data-c="${c}" title="${k} ${mib(v)}"></span>`; }).join("");
    const cap = b.capacity_mib ? ` of ${mib(b.capacity_mib)} (${Math.round(100 * (b.used_share || 0))}%)` : "";
    const top = (b.top_activations || [])[0];
    const note = top ? ` · top activations: ${esc(top.module)} ${Math.round(100 * (top.share || 0))}%` : "";
    return `<div class="membar" data-rank="${b.rank}"><span class="who">rank ${b.rank}</span><span class="bar"${b.capacity_mib ? ` data-w="${(100 * b.capacity_mib / scale).toFixed(3)}"` : ""}>${segs}</span><span class="tot">${mib(b.total_mib || 0)}${cap}${note}</span></div>`;
  }).join("");
  applyStyles($("memkinds"));
}

const PARTS = [["forward", "#4e79a7"], ["backward", "#59a14f"], ["optimizer", "#edc948"],
  ["input", "#e15759"], ["collective", "#b07aa1"], ["host", "#bab0ac"]];

// One bar per rank: where a traced step goes (`probe throughput`'s shares), then tokens/s, MFU
// and the lever.
function renderThroughput(tp) {
  if (!tp) return;
  const rs = (tp.ranks || []).slice().sort((a, b) => a.rank - b.rank);
  if (!rs.length) { $("throughput").textContent = "no optimizer step recorded yet"; return; }
  const pct = (v) => (v == null ? "?" : (100 * v).toFixed(1) + "%");
  const num = (v) => (v == null ? "?" : v >= 1e3 ? (v / 1e3).toFixed(1) + "k" : v.toFixed(1));
  const job = tp.job || {};
  // no "? tokens/s": say why there is no figure (the inputs are not token ids, none logged)
  const tokens = job.tokens_per_s == null
    ? "no token count (inputs are not token ids; probe_agent.log(tokens=N) gives one)"
    : `${num(job.tokens_per_s)} tokens/s · GB_tok ${esc(job.gb_tok ?? "?")}`;
  const legend = PARTS.map(([k, c]) => `<span class="kind"><i data-c="${c}"></i>${k}</span>`).join(" ");
  $("throughput").innerHTML = `<div class="kinds-legend">job: ${tokens} · MFU ${pct(job.mfu)} · ${legend}</div>` + rs.map((r) => {
    const segs = PARTS.map(([k, c]) => { const v = r[k + "_share"] || 0;
      return `<span class="seg" data-part="${k}" data-w="${(100 * v).toFixed(3)}" data-c="${c}" title="${k} ${pct(v)}"></span>`; }).join("");
    const lever = r.lever ? ` · lever: ${esc(r.lever.lever)} ${pct(r.lever.share)}` : "";
    return `<div class="membar tpbar" data-rank="${r.rank}"><span class="who">rank ${r.rank}</span><span class="bar">${segs}</span><span class="tot">${r.tokens_per_s == null ? "" : num(r.tokens_per_s) + " tokens/s · "}MFU ${pct(r.mfu)}${lever}</span></div>`;
  }).join("");
  applyStyles($("throughput"));
}

function renderStacks(tiles) {
  const groups = new Map();
  for (const t of tiles) { const key = t.state === "dead" ? "(no answer)" : (t.stack || []).join("\n");
    if (!groups.has(key)) groups.set(key, []); groups.get(key).push(t); }
  const sorted = [...groups.entries()].sort((a, b) => a[1].length - b[1].length);  // outliers first
  $("stacks").innerHTML = sorted.map(([key, ts], gi) => {
    const lines = key.split("\n"), top = lines[lines.length - 1];
    const ranks = ts.map((t) => t.rank).join(", ");
    const gid = "g:" + key.slice(-200);
    return `<details data-key="${esc(gid)}"${openStacks.has(gid) ? " open" : ""}><summary><b>${ts.length} rank${ts.length > 1 ? "s" : ""}</b> [${esc(ranks)}] in ${esc(top)}</summary>`
      + `<pre>${esc(key)}</pre>`
      + ts.map((t) => `<details><summary>rank ${t.rank} (${esc(t.host)}) ${esc(STATES[t.state] || t.state)}</summary><pre>${esc((t.stack || []).join("\n") || t.error || "")}</pre></details>`).join("")
      + "</details>";
  }).join("");
  for (const d of $("stacks").querySelectorAll("details[data-key]"))
    d.addEventListener("toggle", () => (d.open ? openStacks.add(d.dataset.key) : openStacks.delete(d.dataset.key)));
}

async function refresh() {
  try {
    const snap = await (await fetch("/api/snapshot", { cache: "no-store", headers: KEY })).json();
    const tiles = (snap.tiles || []).slice().sort((a, b) => (a.rank ?? 1e9) - (b.rank ?? 1e9));
    const counts = {};
    for (const t of tiles) counts[t.state] = (counts[t.state] || 0) + 1;
    $("summary").textContent = `${tiles.length} ranks · ` + Object.entries(counts).map(([k, n]) => `${n} ${STATES[k] || k}`).join(" · ")
      + (snap.error ? ` · error: ${snap.error}` : "");
    $("updated").textContent = snap.refreshed_at ? `updated ${new Date(snap.refreshed_at * 1000).toLocaleTimeString()} · fan-out ${snap.fanout_ms} ms` : "first refresh…";
    renderTiles(tiles);
    lineChart("steptime", tiles, "duration", "s", fmtMs, true);
    lineChart("loss", tiles, "loss", "", (v) => v.toPrecision(4), false);
    markLoss("loss", tiles);
    const cuda = tiles.some((t) => (t.series || []).some((p) => p.allocated));
    $("memkind").textContent = cuda ? "(CUDA allocated, MiB)" : "(job memory: RSS less agent and free heap, MiB)";
    lineChart("memory", tiles, cuda ? "allocated" : "job_mib", "MiB", (v) => v.toFixed(0) + " MiB", false);
    renderHeatmap(snap.slow, snap.slow_at);
    banners(snap.verdicts || {}, snap.stale_s);
    renderMemKinds((snap.verdicts || {}).doctor);
    renderThroughput(snap.throughput);
    renderStacks(tiles);
  } catch (e) {
    $("summary").textContent = "probe ui is not answering: " + e;
  }
}

async function runSql(ev) {
  ev.preventDefault();
  const sql = $("sql").value;
  $("sqlstatus").textContent = "running…";
  $("csv").href = "/api/query.csv?sql=" + encodeURIComponent(sql);
  const res = await (await fetch("/api/query", { method: "POST", headers: { ...KEY, "Content-Type": "application/json" },
    body: JSON.stringify({ sql }) })).json();
  $("sqlstatus").textContent = `${(res.rows || []).length} rows`;
  const head = `<tr>${(res.columns || []).map((c) => `<th>${esc(c)}</th>`).join("")}</tr>`;
  const body = (res.rows || []).slice(0, 500).map((r) => `<tr>${r.map((v) => `<td>${esc(v)}</td>`).join("")}</tr>`).join("");
  $("sqlresult").innerHTML = (res.errors || []).map((e) => `<p class="err">${esc(e)}</p>`).join("")
    + (res.columns && res.columns.length ? `<table id="sqltable">${head}${body}</table>` : "");
}

// The CSV link's href shows what it fetches; the download itself is a fetch with the page's
// key (data routes need the header, which a link cannot send), saved from a blob.
async function downloadCsv(ev) {
  ev.preventDefault();
  const res = await fetch($("csv").getAttribute("href"), { headers: KEY });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(await res.blob());
  a.download = "probe-query.csv";
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
}

renderLegend();
$("sqlform").addEventListener("submit", runSql);
$("csv").addEventListener("click", downloadCsv);
$("csv").href = "/api/query.csv?sql=" + encodeURIComponent($("sql").value);
$("sql").addEventListener("input", () => { $("csv").href = "/api/query.csv?sql=" + encodeURIComponent($("sql").value); });
refresh();
setInterval(refresh, REFRESH_MS);
