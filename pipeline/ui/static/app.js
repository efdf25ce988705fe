// simpipe manager: a single page over the JSON API. No framework, no build step, no CDN:
// it must work offline on a login node. Data is only ever put into the page as text nodes.
"use strict";

const CSRF = document.querySelector('meta[name="csrf-token"]').content;
const SVG_NS = "http://www.w3.org/2000/svg";
const view = document.getElementById("view");
let teardown = [];  // what the current view must stop (timers, event streams) when left

// --- small helpers --------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick") el.addEventListener("click", v);
    else if (k === "className") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const fmt = {
  int: (v) => (v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US")),
  num: (v, d = 2) => (v === null || v === undefined ? "–" : Number(v).toFixed(d)),
  secs: (v) => {
    if (v === null || v === undefined) return "–";
    if (v < 60) return `${Number(v).toFixed(1)} s`;
    if (v < 3600) return `${Math.floor(v / 60)} min ${Math.round(v % 60)} s`;
    return `${Math.floor(v / 3600)} h ${Math.round((v % 3600) / 60)} min`;
  },
  bytes: (v) => (v ? `${(v / 2 ** 30).toFixed(2)} GiB` : "–"),
};

function capitalized(text) { return text.charAt(0).toUpperCase() + text.slice(1); }

function badge(state) { return h("span", { className: `badge ${state}` }, state); }

// A URL from a state file goes into an href only if it is http(s): never javascript: or data:.
function httpUrl(text) {
  if (typeof text !== "string") return null;
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch (e) { return null; }
}

function toast(message, isError) {
  const box = h("div", { className: isError ? "err" : "" }, message);
  document.getElementById("toast").append(box);
  setTimeout(() => box.remove(), 6000);
}

async function api(path, options = {}) {
  const init = { credentials: "same-origin", headers: { Accept: "application/json" }, ...options };
  if (init.method && init.method !== "GET") {
    init.headers = { ...init.headers, "X-CSRF-Token": CSRF, "Content-Type": "application/json" };
  }
  const resp = await fetch(path, init);
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (!resp.ok) throw new Error((body && body.error) || `${resp.status} ${resp.statusText}`);
  return body;
}

function every(ms, fn) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    if (stopped) return;
    try { await fn(); setConn(""); } catch (e) { setConn(`update failed: ${e.message}`); }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  teardown.push(() => { stopped = true; clearTimeout(timer); });
}

function setConn(text) { document.getElementById("conn").textContent = text; }

function confirmDialog(text, typeName) {
  const dlg = document.getElementById("confirm");
  const input = document.getElementById("confirm-input");
  const yes = document.getElementById("confirm-yes");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-type-wrap").hidden = !typeName;
  document.getElementById("confirm-name").textContent = typeName || "";
  input.value = "";
  yes.disabled = Boolean(typeName);
  input.oninput = () => { yes.disabled = input.value !== typeName; };
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
    dlg.returnValue = "";
    dlg.showModal();
    if (typeName) input.focus();
  });
}

// --- actions --------------------------------------------------------------------------------

async function cancelRun(name) {
  if (!(await confirmDialog(`Cancel run ${name}? It stops at the next partition and can be resumed with simpipe run CONFIG --resume.`))) return false;
  try { await api(`/api/runs/${encodeURIComponent(name)}/cancel`, { method: "POST", body: "{}" }); toast(`cancel requested: ${name}`); return true; }
  catch (e) { toast(`cancel ${name}: ${e.message}`, true); return false; }
}

async function deleteRun(name) {
  if (!(await confirmDialog(`Delete every result file of run ${name}? This cannot be undone.`, name))) return false;
  try {
    await api(`/api/runs/${encodeURIComponent(name)}/delete`, { method: "POST", body: JSON.stringify({ confirm: name }) });
    toast(`deleted: ${name}`);
    return true;
  } catch (e) { toast(`delete ${name}: ${e.message}`, true); return false; }
}

async function clusterDown(name) {
  if (!(await confirmDialog(`Bring cluster ${name} down? Its workers, servers and every SLURM job are cancelled.`))) return false;
  toast(`bringing ${name} down…`);
  try {
    const r = await api(`/api/clusters/${encodeURIComponent(name)}/down`, { method: "POST", body: "{}" });
    toast(`${name} is down (${r.cancelled_jobs.length} jobs cancelled)`);
    return true;
  } catch (e) { toast(`down ${name}: ${e.message}`, true); return false; }
}

// --- Runs -----------------------------------------------------------------------------------

function runsTable(rows) {
  const head = h("tr", {}, ["run", "state", "config", "rounds", "agents", "ok", "unparsed",
    "out of range", "error", "wall", "tokens in", "tokens out", "report"].map(
    (t, i) => h("th", { className: i >= 3 && i <= 11 ? "num" : "" }, t)));
  const body = rows.map((r) => h("tr", { "data-run": r.name, "data-state": r.state },
    h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(r.name)}` }, r.name)),
    h("td", {}, badge(r.state), r.cancel_requested && r.state === "running" ? h("span", { className: "muted" }, " cancelling") : null,
      r.problem ? h("div", { className: "note problem", "data-col": "problem" }, r.problem) : null),
    h("td", { className: "muted", title: r.config_hash || "" }, (r.config_hash || "").slice(0, 10)),
    h("td", { className: "num", "data-col": "rounds" }, `${r.rounds_done}/${r.rounds_total ?? "–"}`),
    h("td", { className: "num", "data-col": "agents" }, fmt.int(r.n_agents)),
    h("td", { className: "num", "data-col": "ok" }, fmt.int(r.counts.ok)),
    h("td", { className: "num", "data-col": "unparsed" }, fmt.int(r.counts.unparsed)),
    h("td", { className: "num", "data-col": "out_of_range" }, fmt.int(r.counts.out_of_range)),
    h("td", { className: "num", "data-col": "error" }, fmt.int(r.counts.error)),
    h("td", { className: "num", "data-col": "wall" }, fmt.secs(r.wall_s)),
    h("td", { className: "num", "data-col": "tokens_in" }, fmt.int(r.tokens_in)),
    h("td", { className: "num", "data-col": "tokens_out" }, fmt.int(r.tokens_out)),
    h("td", {}, r.has_report ? h("a", { href: `/runs/${encodeURIComponent(r.name)}/report`, target: "_blank", rel: "noopener" }, "report") : h("span", { className: "muted" }, "–"))));
  return h("table", { id: "runs-table" }, h("thead", {}, head), h("tbody", {}, body));
}

function showRuns() {
  const box = h("div", {});
  view.replaceChildren(h("h2", {}, "Runs"), box);
  every(2000, async () => {
    const data = await api("/api/runs");
    box.replaceChildren(
      h("p", { className: "muted" }, `results root: ${data.results}`),
      data.runs.length ? runsTable(data.runs) : h("p", { className: "muted" }, "No runs yet: start one with simpipe run CONFIG."));
  });
}

// --- One run, live --------------------------------------------------------------------------

const SERIES_COLORS = [["#2563eb", "sw-mean"], ["#ea7a0c", "sw-target"], ["#16a34a", "sw-win"]];

// The game's per-round chart as the API describes it (run.chart: y range, series, levels,
// human reference); the beauty contest's is mean, target and winning guess. x(r): round
// index r from 0 (the API numbers rounds from 1).
function lineChart(run) {
  const W = 620, H = 280, L = 44, R = 12, T = 12, B = 34;
  const chart = run.chart;
  const [lo, hi] = chart.y_range.map(Number);
  const nRounds = Math.max(run.rounds_total || 1, 1);
  const x = (r) => L + (nRounds === 1 ? (W - L - R) / 2 : (r * (W - L - R)) / (nRounds - 1));
  const y = (v) => T + (H - T - B) * (1 - (v - lo) / (hi - lo || 1));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": chart.title, id: "chart-rounds" });
  for (let i = 0; i <= 4; i++) {
    const v = lo + ((hi - lo) * i) / 4;
    svg.append(s("line", { class: "gridline", x1: L, x2: W - R, y1: y(v), y2: y(v) }),
      s("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, fmt.num(v, 0)));
  }
  for (let r = 0; r < nRounds; r++) svg.append(s("text", { x: x(r), y: H - B + 16, "text-anchor": "middle" }, r + 1));
  svg.append(s("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, "round"),
    s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }),
    s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  for (const [name, value] of chart.levels) {
    svg.append(s("line", { x1: L, x2: W - R, y1: y(value), y2: y(value), stroke: "#8a93a3", "stroke-dasharray": "6 4", "stroke-width": 1.5 },
      s("title", {}, `${name} ${fmt.num(value)}`)));
  }
  const ref = chart.reference;
  if (ref) {  // human data, as far as it goes
    const pts = ref.values.slice(0, nRounds).map((v, r) => [r, v]);
    svg.append(s("polyline", { id: "chart-reference", fill: "none", stroke: "#8a93a3", "stroke-width": 1.5, "stroke-dasharray": "3 3", points: pts.map(([r, v]) => `${x(r)},${y(v)}`).join(" ") },
      s("title", {}, ref.label)));
  }
  chart.series.forEach(([key], i) => {
    const color = SERIES_COLORS[i % SERIES_COLORS.length][0];
    const pts = run.rounds.filter((p) => p[key] !== null && p[key] !== undefined);
    if (!pts.length) return;
    svg.append(s("polyline", { fill: "none", stroke: color, "stroke-width": 2, points: pts.map((p) => `${x(p.round - 1)},${y(p[key])}`).join(" ") }));
    for (const p of pts) svg.append(s("circle", { cx: x(p.round - 1), cy: y(p[key]), r: 3.5, fill: color }, s("title", {}, `round ${p.round} ${key}: ${fmt.num(p[key])}`)));
  });
  const legend = h("div", { className: "legend" },
    chart.series.map(([, label], i) => h("span", {}, h("i", { className: SERIES_COLORS[i % SERIES_COLORS.length][1] }), label)),
    chart.levels.map(([name, value]) => h("span", {}, h("i", { className: "sw-eq" }), `${name} ${fmt.num(value)}`)),
    ref ? h("span", {}, h("i", { className: "sw-ref" }), ref.label) : null);
  return h("div", {}, svg, legend);
}

function histogram(run) {
  const hist = run.histogram;
  if (!hist) return h("p", { className: "muted" }, run.problem && run.rounds.length ? "Not available: see the problem above." : "No round finished yet.");
  const W = 620, H = 240, L = 44, R = 12, T = 12, B = 34;
  const lo = hist.edges[0], hi = hist.edges[hist.edges.length - 1];
  const max = Math.max(1, ...hist.counts);
  const x = (v) => L + ((v - lo) * (W - L - R)) / (hi - lo || 1);
  const y = (c) => T + (H - T - B) * (1 - c / max);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": `histogram of the latest round's ${run.answer_plural}`, id: "chart-hist" });
  for (let i = 0; i <= 4; i++) {
    const c = (max * i) / 4;
    svg.append(s("line", { class: "gridline", x1: L, x2: W - R, y1: y(c), y2: y(c) }), s("text", { x: L - 6, y: y(c) + 4, "text-anchor": "end" }, Math.round(c)));
  }
  hist.counts.forEach((c, i) => {
    const x0 = x(hist.edges[i]), x1 = x(hist.edges[i + 1]);
    svg.append(s("rect", { x: x0 + 1, width: Math.max(x1 - x0 - 2, 1), y: y(c), height: H - B - y(c), fill: "#93c5fd" },
      s("title", {}, `${fmt.num(hist.edges[i], 1)}–${fmt.num(hist.edges[i + 1], 1)}: ${c}`)));
  });
  for (let i = 0; i <= 4; i++) {
    // Whole numbers inside the bins' span (one bar per point spans -0.5..20.5: 0 to 20).
    const v = Math.min(Math.max(Math.round(lo + ((hi - lo) * i) / 4), Math.ceil(lo)), Math.floor(hi));
    svg.append(s("text", { x: x(v), y: H - B + 16, "text-anchor": "middle" }, fmt.num(v, 0)));
  }
  svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  const mark = hist.mark;  // the round's own line (the beauty contest: its target)
  if (mark) {
    svg.append(s("line", { x1: x(mark.value), x2: x(mark.value), y1: T, y2: H - B, stroke: "#ea7a0c", "stroke-width": 2 }, s("title", {}, `${mark.label} ${fmt.num(mark.value)}`)));
  }
  if (run.equilibrium !== null && run.equilibrium !== undefined) {
    svg.append(s("line", { x1: x(run.equilibrium), x2: x(run.equilibrium), y1: T, y2: H - B, stroke: "#8a93a3", "stroke-dasharray": "6 4", "stroke-width": 1.5 }));
  }
  return h("div", {}, svg, h("div", { className: "legend" },
    h("span", {}, `round ${hist.round}: ${fmt.int(hist.n_valid)} valid ${run.answer_plural} of ${fmt.int(hist.n)}`),
    mark ? h("span", {}, h("i", { className: "sw-target" }), mark.label) : null, h("span", {}, h("i", { className: "sw-eq" }), run.equilibrium_name)));
}

function progressCard(run) {
  const p = run.progress;
  const card = h("div", { className: "card", id: "progress" });
  if (run.state !== "running" || !p) {
    card.append(h("p", {}, run.state === "running" ? "Between rounds…" : `Not running (${run.rounds_done}/${run.rounds_total} rounds done).`));
    return card;
  }
  // The round's plan, before any agent plays: its stage's tasks (hours at a million agents).
  // The bar is the share of the stage's work done (tasks weighed by size: a chunk of 256
  // walked prompts is not the wait of a small tree); a run.json without it counts tasks.
  const plan = p.planning;
  if (plan) {
    const work = plan.work_done != null ? plan.work_done : plan.tasks_total ? plan.tasks_done / plan.tasks_total : 0;
    const fill = h("div", {});
    fill.style.width = `${(work * 100).toFixed(1)}%`;
    card.append(
      h("p", {}, `Round ${p.round} of ${run.rounds_total}: planning the answers (${plan.stage}): `,
        h("strong", { id: "plan-tasks" }, `${fmt.int(plan.tasks_done)}/${fmt.int(plan.tasks_total)}`), " tasks",
        plan.work_done != null ? h("span", { id: "plan-work" }, ` (${Math.floor(plan.work_done * 100)} % of the work)`) : "",
        p.agents_total ? `, then ${fmt.int(p.agents_total)} agents` : "",
        `, ${fmt.secs(p.elapsed_s)}`, plan.eta_s != null ? `, ETA ${fmt.secs(plan.eta_s)}` : ""),
      h("div", { className: "bar" }, fill));
    return card;
  }
  // Agents, counted inside partitions as they play; partitions where agents_total is absent.
  const frac = p.agents_total ? p.agents_done / p.agents_total : p.partitions_total ? p.partitions_done / p.partitions_total : 0;
  const fill = h("div", {});
  fill.style.width = `${(frac * 100).toFixed(1)}%`;  // CSSOM, allowed by the page's CSP
  card.append(
    h("p", {}, `Round ${p.round} of ${run.rounds_total}: `,
      h("strong", { id: "partitions" }, `${p.partitions_done}/${p.partitions_total}`), " partitions, ",
      h("span", { id: "agents-done" }, p.agents_total ? `${fmt.int(p.agents_done)}/${fmt.int(p.agents_total)}` : fmt.int(p.agents_done)), " agents, ",
      p.agents_per_s ? `${fmt.int(Math.round(p.agents_per_s))} agents/s` : "– agents/s",
      p.distinct_prompts || p.model_calls ? `, ${fmt.int(p.distinct_prompts)} distinct prompts, ${fmt.int(p.model_calls)} model calls` : "",
      `, ${fmt.secs(p.elapsed_s)}`, p.eta_s != null ? `, ETA ${fmt.secs(p.eta_s)}` : ""),
    h("div", { className: "bar" }, fill));
  return card;
}

// Status counts, then the game's own columns (run.round_columns: [key, header]).
function roundsTable(run) {
  const game = run.round_columns;
  const cols = ["round", "n", "valid", "unparsed", "out of range", "error", "truncated", "no final answer", ...game.map(([, label]) => label), "time", "agents/s"];
  return h("table", { id: "rounds-table" }, h("thead", {}, h("tr", {}, cols.map((c) => h("th", { className: c === "round" ? "" : "num" }, c)))),
    h("tbody", {}, run.rounds.map((r) => h("tr", { "data-round": r.round },
      h("td", {}, r.round), h("td", { className: "num" }, fmt.int(r.n)), h("td", { className: "num" }, fmt.int(r.n_valid)),
      h("td", { className: "num" }, fmt.int(r.n_unparsed)), h("td", { className: "num" }, fmt.int(r.n_out_of_range)),
      h("td", { className: "num" }, fmt.int(r.n_error)),
      h("td", { className: "num", "data-col": "n_truncated" }, fmt.int(r.n_truncated)),
      h("td", { className: "num", "data-col": "n_no_final_answer" }, fmt.int(r.n_no_final_answer)),
      game.map(([key]) => h("td", { className: key === "mean" && r.valid_enough === false ? "num flagged" : "num", "data-col": key, title: key === "mean" && r.flag ? `not valid enough: ${r.flag}` : null }, fmt.num(r[key]), key === "mean" && r.valid_enough === false ? " \u26A0" : "")),
      h("td", { className: "num" }, fmt.secs(r.elapsed_s)),
      h("td", { className: "num" }, fmt.int(r.agents_per_s ? Math.round(r.agents_per_s) : null))))));
}

function endpointsTable(run) {
  const names = Object.keys(run.endpoints || {});
  if (!names.length) return h("p", { className: "muted" }, "No endpoint counters (scripted agents make no requests).");
  const cols = ["endpoint", "requests", "errors", "retries", "marked down", "tokens in", "tokens out", "mean latency"];
  return h("table", { id: "endpoints-table" }, h("thead", {}, h("tr", {}, cols.map((c, i) => h("th", { className: i ? "num" : "" }, c)))),
    h("tbody", {}, names.map((n) => {
      const e = run.endpoints[n];
      // A server the run lost (refused or timed out DOWN_AFTER times in a row) is marked.
      const lost = Number(e.marked_down) > 0 ? [" ", h("span", { className: "badge failed" }, "lost")] : [];
      return h("tr", { className: lost.length ? "endpoint-lost" : "" }, h("td", {}, n, ...lost), h("td", { className: "num" }, fmt.int(e.requests)),
        h("td", { className: "num" }, fmt.int(e.errors)), h("td", { className: "num" }, fmt.int(e.retries)), h("td", { className: "num" }, fmt.int(e.marked_down)),
        h("td", { className: "num" }, fmt.int(e.tokens_in)), h("td", { className: "num" }, fmt.int(e.tokens_out)),
        h("td", { className: "num" }, e.requests ? `${fmt.num((e.latency_s_sum / e.requests) * 1000, 0)} ms` : "–"));
    })));
}

function renderRun(box, run) {
  // Machine-readable marks for tests and scripts: what the page shows right now.
  box.dataset.state = run.state;
  box.dataset.roundsDone = String(run.rounds_done);
  box.dataset.partitionsDone = run.progress ? `${run.progress.round}:${run.progress.partitions_done}` : "";
  box.dataset.agentsDone = run.progress ? `${run.progress.round}:${run.progress.agents_done}` : "";
  if (run.state === "broken") {  // its run.json cannot be read: say why, show nothing else
    box.replaceChildren(h("h2", {}, `Run ${run.name} `, badge(run.state)),
      h("p", { className: "note problem", id: "run-problem" }, run.problem));
    return;
  }
  const buttons = h("div", { className: "actions" });
  if (run.state === "running" && !run.cancel_requested) {
    buttons.append(h("button", { id: "cancel-run", className: "danger", onclick: () => cancelRun(run.name) }, "Cancel run"));
  }
  if (["finished", "failed", "interrupted"].includes(run.state)) {
    buttons.append(h("button", { id: "delete-run", className: "danger", onclick: async () => { if (await deleteRun(run.name)) location.hash = "#/runs"; } }, "Delete results…"));
  }
  if (run.has_report) buttons.append(h("a", { href: `/runs/${encodeURIComponent(run.name)}/report`, target: "_blank", rel: "noopener" }, "open report"));
  box.replaceChildren(...[
    h("h2", {}, `Run ${run.name} `, badge(run.state), run.cancel_requested && run.state === "running" ? h("span", { className: "muted" }, " cancel requested") : null),
    run.state_note ? h("p", { className: "note" }, `The ledger says ${run.ledger_state}, but ${run.state_note}: shown as ${run.state}; simpipe run CONFIG --resume continues it.`) : null,
    run.error ? h("p", { className: "note" }, `error: ${run.error}`) : null,
    run.problem ? h("p", { className: "note problem", id: "run-problem" }, run.problem) : null,
    buttons,
    h("div", { className: "card" }, h("dl", { className: "kv" },
      h("dt", {}, "game"), h("dd", { id: "game-line" }, run.describe),
      h("dt", {}, "agents"), h("dd", {}, `${fmt.int(run.n_agents)} in ${run.n_partitions} partitions, backend ${run.backend}` + (run.answers_source && run.answers_source !== "model" ? `, ${run.answers_source} answers` : "")),
      h("dt", {}, "config hash"), h("dd", {}, run.config_hash || "–"),
      h("dt", {}, "rounds"), h("dd", { id: "rounds-done" }, `${run.rounds_done}/${run.rounds_total}`),
      h("dt", {}, "wall time"), h("dd", {}, fmt.secs(run.wall_s)),
      h("dt", {}, "tokens"), h("dd", {}, `${fmt.int(run.tokens_in)} in, ${fmt.int(run.tokens_out)} out`),
      h("dt", {}, "scheduler"), h("dd", {}, run.scheduler || "–"),
      h("dt", {}, "updated"), h("dd", {}, run.updated_at || "–"))),
    progressCard(run),
    h("div", { className: "grid" },
      h("div", { className: "card" }, h("h3", {}, capitalized(run.chart.title)), lineChart(run)),
      h("div", { className: "card" }, h("h3", {}, `${capitalized(run.answer_plural)} in the latest round`), histogram(run))),
    h("h3", {}, "Rounds"), run.rounds.length ? roundsTable(run) : h("p", { className: "muted" }, "No round finished yet."),
    h("h3", {}, "Endpoints"), endpointsTable(run)].filter(Boolean));
}

// An agent's prompt on request, rebuilt by the server from the run's files. Beside the live
// view, not inside it: the view is redrawn on every update and would wipe what was asked.
function promptCard(name) {
  const agent = h("input", { id: "prompt-agent", type: "number", min: "0", value: "0", size: 8 });
  const round = h("input", { id: "prompt-round", type: "number", min: "1", value: "1", size: 4 });
  const out = h("pre", { id: "agent-prompt", className: "prompt" });
  const note = h("p", { id: "agent-prompt-note", className: "muted" });
  const show = async () => {
    out.textContent = "";
    note.textContent = "…";
    try {
      const p = await api(`/api/runs/${encodeURIComponent(name)}/prompt?agent=${encodeURIComponent(agent.value)}&round=${encodeURIComponent(round.value)}`);
      note.textContent = `agent ${p.agent_id}, round ${p.round} of ${p.rounds_total}, group ${p.group_id}, ${p.style} prompt, ` +
        (p.tokens_in === null ? "not played yet" : `${fmt.int(p.tokens_in)} prompt tokens as the model counted`);
      out.textContent = p.text;  // text, never markup: a persona is untrusted
    } catch (e) {
      note.textContent = e.message;
    }
  };
  return h("div", { className: "card", id: "prompt-card" }, h("h3", {}, "An agent's prompt"),
    h("p", {}, "agent ", agent, " round ", round, " ", h("button", { id: "show-prompt", onclick: show }, "Show prompt")),
    note, out);
}

function showRun(name) {
  const box = h("div", { id: "run-view", "data-run": name });
  view.replaceChildren(h("p", {}, h("a", { href: "#/runs" }, "← all runs")), box, promptCard(name));
  const source = new EventSource(`/api/runs/${encodeURIComponent(name)}/events`);
  source.onmessage = (ev) => { renderRun(box, JSON.parse(ev.data)); setConn("live"); };
  source.addEventListener("gone", () => { source.close(); toast(`run ${name} is gone`); location.hash = "#/runs"; });
  source.onerror = () => setConn("reconnecting…");
  teardown.push(() => source.close());
}

// --- Clusters -------------------------------------------------------------------------------

function clusterCard(c, st) {
  const card = h("div", { className: "card", "data-cluster": c.name });
  const dashboard = httpUrl(c.dashboard_url);
  card.append(h("h3", {}, `Cluster ${c.name} `, badge(c.state), " ",
    h("button", { className: "danger", "data-action": "down", onclick: () => clusterDown(c.name) }, "Bring down")));
  card.append(h("dl", { className: "kv" },
    h("dt", {}, "scheduler"), h("dd", {}, c.scheduler || "–"),
    h("dt", {}, "dashboard"), h("dd", { "data-col": "dashboard" }, dashboard ? h("a", { href: dashboard, target: "_blank", rel: "noopener" }, c.dashboard) : (c.dashboard || "–")),
    h("dt", {}, "manager"), h("dd", {}, c.manager_alive ? "alive" : "not running"),
    c.error ? h("dt", {}, "error") : null, c.error ? h("dd", { className: "note" }, c.error) : null,
    c.problem ? h("dt", {}, "problem") : null, c.problem ? h("dd", { className: "note problem" }, c.problem) : null));
  if (!st) { card.append(h("p", { className: "muted" }, "asking SLURM and the scheduler…")); return card; }
  if (st.problem && st.problem !== c.problem) card.append(h("p", { className: "note" }, st.problem));
  card.append(h("h3", {}, "Workers"), st.workers.length ? h("table", {}, h("thead", {}, h("tr", {}, ["address", "host", "memory", "limit", "tasks"].map((t) => h("th", {}, t)))),
    h("tbody", {}, st.workers.map((w) => h("tr", {}, h("td", {}, w.address), h("td", {}, w.host), h("td", {}, fmt.bytes(w.memory)), h("td", {}, fmt.bytes(w.memory_limit)), h("td", {}, w.tasks)))))
    : h("p", { className: "muted" }, "no workers connected"));
  card.append(h("h3", {}, "Inference servers"), st.servers.length ? h("table", {}, h("thead", {}, h("tr", {}, ["#", "url", "job", "health", "requests served"].map((t) => h("th", {}, t)))),
    h("tbody", {}, st.servers.map((v) => h("tr", {}, h("td", {}, v.index), h("td", {}, v.url || "–"), h("td", {}, v.job_id), h("td", {}, v.health), h("td", {}, v.requests ?? "–")))))
    : h("p", { className: "muted" }, "no servers"));
  card.append(h("h3", {}, "SLURM jobs"), st.jobs.length ? h("table", { "data-jobs": c.name }, h("thead", {}, h("tr", {}, ["job", "name", "state", "time left", "nodes"].map((t) => h("th", {}, t)))),
    h("tbody", {}, st.jobs.map((j) => h("tr", {}, h("td", {}, j.job_id), h("td", {}, j.name), h("td", {}, j.state), h("td", {}, j.time_left), h("td", {}, j.nodes)))))
    : h("p", { className: "muted" }, "no SLURM jobs"));
  return card;
}

function showClusters() {
  const box = h("div", { id: "clusters" });
  view.replaceChildren(h("h2", {}, "Clusters"), box);
  const statuses = {};
  every(4000, async () => {
    const data = await api("/api/clusters");
    const render = () => box.replaceChildren(...(data.clusters.length ? data.clusters.map((c) => clusterCard(c, statuses[c.name]))
      : [h("p", { className: "muted" }, "No clusters: start one with simpipe cluster up CONFIG --name NAME.")]));
    render();
    await Promise.all(data.clusters.map(async (c) => {
      try { statuses[c.name] = await api(`/api/clusters/${encodeURIComponent(c.name)}`); } catch (e) { statuses[c.name] = { problem: e.message, workers: [], servers: [], jobs: [] }; }
    }));
    render();
  });
}

// --- Actions --------------------------------------------------------------------------------

function showActions() {
  const box = h("div", { id: "actions" });
  view.replaceChildren(h("h2", {}, "Actions"), box);
  const refresh = async () => {
    const [runs, cl] = await Promise.all([api("/api/runs"), api("/api/clusters")]);
    const running = runs.runs.filter((r) => r.state === "running");
    const done = runs.runs.filter((r) => ["finished", "failed", "interrupted"].includes(r.state));
    const row = (label, extra, button) => h("tr", {}, h("td", {}, label), h("td", {}, extra), h("td", {}, button));
    box.replaceChildren(
      h("h3", {}, "Cancel a running run"), h("p", { className: "muted" }, "It stops at the next clean point (between partitions) and stays resumable: simpipe run CONFIG --resume."),
      running.length ? h("table", {}, h("tbody", {}, running.map((r) => row(h("a", { href: `#/runs/${encodeURIComponent(r.name)}` }, r.name),
        r.cancel_requested ? "cancel requested" : `${r.rounds_done}/${r.rounds_total} rounds`,
        h("button", { className: "danger", "data-action": "cancel", "data-run": r.name, disabled: r.cancel_requested, onclick: async () => { if (await cancelRun(r.name)) refresh(); } }, "Cancel")))))
        : h("p", { className: "muted" }, "No run is running."),
      h("h3", {}, "Bring a cluster down"), h("p", { className: "muted" }, "Stops its manager and cancels all its SLURM jobs (workers and inference servers)."),
      cl.clusters.length ? h("table", {}, h("tbody", {}, cl.clusters.map((c) => row(c.name, c.state,
        h("button", { className: "danger", "data-action": "down", "data-cluster": c.name, onclick: async () => { if (await clusterDown(c.name)) refresh(); } }, "Bring down")))))
        : h("p", { className: "muted" }, "No clusters."),
      h("h3", {}, "Delete a run's results"), h("p", { className: "muted" }, "Only runs that are not running; you type the name to confirm."),
      done.length ? h("table", {}, h("tbody", {}, done.map((r) => row(r.name, r.state,
        h("button", { className: "danger", "data-action": "delete", "data-run": r.name, onclick: async () => { if (await deleteRun(r.name)) refresh(); } }, "Delete…")))))
        : h("p", { className: "muted" }, "Nothing to delete."));
  };
  every(5000, refresh);
}

// --- router ---------------------------------------------------------------------------------

function route() {
  for (const stop of teardown) stop();
  teardown = [];
  const hash = location.hash || "#/runs";
  const [, page, arg] = hash.match(/^#\/([a-z]+)(?:\/(.+))?$/) || [];
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === (page || "runs")));
  if (page === "runs" && arg) showRun(decodeURIComponent(arg));
  else if (page === "clusters") showClusters();
  else if (page === "actions") showActions();
  else showRuns();
}

window.addEventListener("hashchange", route);
route();
