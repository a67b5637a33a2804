// yarnflow web UI: plain JavaScript over the REST API (no build step, no CDN).
// Views (location hash): #/overview, #/jobs, #/jobs/<jid>[/<tab>], #/taskmanagers[/<id>].
"use strict";

const REFRESH_MS = 2000;
const STATE_COLORS = {
  RUNNING: "#2d8a4e", INITIALIZING: "#2d8a4e", DEPLOYING: "#3f9a62", SCHEDULED: "#8a94a3", CREATED: "#8a94a3",
  FINISHED: "#5b6b7c", FAILED: "#c23b3b", CANCELING: "#b0771c", CANCELED: "#b0771c",
};
let timer = null;

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

async function api(path, options) {
  const response = await fetch(path, options);
  if (response.status === 401) {  // the REST API wants the cluster's token: sign in first
    location.href = "/login";
    throw new Error("401: sign in with the cluster's REST token");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = (body.errors || [response.statusText]).join("; ");
    throw new Error(`${response.status}: ${message}`);
  }
  return body;
}

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message || "";
  box.hidden = !message;
}

function fmtTime(ms) { return ms > 0 ? new Date(ms).toLocaleString() : "-"; }
function fmtDuration(ms) {
  if (ms < 0) return "-";
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m}m ${s % 60}s` : `${Math.floor(m / 60)}h ${m % 60}m`;
}
function fmtRate(r) {
  if (!r) return "0";
  if (r >= 1e6) return `${(r / 1e6).toFixed(1)}M`;
  if (r >= 1e3) return `${(r / 1e3).toFixed(1)}k`;
  return r.toFixed(r < 10 ? 1 : 0);
}
function fmtBytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function state(s) { return `<span class="state ${esc(s)}">${esc(s)}</span>`; }
function card(label, value, id) {
  return `<div class="card" id="${id}"><div class="num">${esc(value)}</div><div class="label">${esc(label)}</div></div>`;
}

// ---- views ------------------------------------------------------------------------------------

async function overview(view) {
  const [o, jobs] = await Promise.all([api("/overview"), api("/jobs/overview")]);
  view.innerHTML = `<h2>Overview</h2><div class="cards">
      ${card("TaskExecutors", o.taskmanagers, "card-taskmanagers")}
      ${card("Slots total", o["slots-total"], "card-slots-total")}
      ${card("Slots free", o["slots-available"], "card-slots-available")}
      ${card("Running jobs", o["jobs-running"], "card-jobs-running")}
      ${card("Finished jobs", o["jobs-finished"], "card-jobs-finished")}
      ${card("Failed jobs", o["jobs-failed"], "card-jobs-failed")}
      ${card("Canceled jobs", o["jobs-cancelled"], "card-jobs-cancelled")}
    </div><h3>Jobs</h3>${jobTable(jobs.jobs)}`;
  bindRows(view);
}

function jobTable(jobs) {
  if (!jobs.length) return `<p class="muted">No jobs yet.</p>`;
  const rows = jobs.map((j) => `<tr class="link" data-href="#/jobs/${esc(j.jid)}">
      <td>${esc(j.name)}</td><td>${state(j.state)}</td><td>${fmtTime(j["start-time"])}</td>
      <td>${fmtDuration(j.duration)}</td><td>${j.tasks.running}/${j.tasks.total}</td><td class="muted">${esc(j.jid)}</td></tr>`);
  return `<table id="jobs-table"><thead><tr><th>Name</th><th>State</th><th>Started</th><th>Duration</th>
      <th>Tasks running</th><th>Id</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

function bindRows(view) {
  view.querySelectorAll("tr.link").forEach((tr) => tr.addEventListener("click", () => { location.hash = tr.dataset.href; }));
}

async function jobs(view) {
  const data = await api("/jobs/overview");
  view.innerHTML = `<h2>Jobs</h2>${jobTable(data.jobs)}`;
  bindRows(view);
}

async function job(view, jid, tab) {
  const j = await api(`/jobs/${jid}`);
  const running = !["FINISHED", "FAILED", "CANCELED", "SUSPENDED"].includes(j.state);
  tab = tab || "subtasks";
  const tabs = ["subtasks", "exceptions", "checkpoints", "spark"].map((t) =>
    `<a href="#/jobs/${esc(jid)}/${t}" class="${t === tab ? "active" : ""}" id="tab-${t}">${t[0].toUpperCase() + t.slice(1)}</a>`);
  view.innerHTML = `<div class="toolbar"><h2>${esc(j.name)}</h2>${state(j.state)}
      <span class="muted">${esc(j.jid)} · started ${fmtTime(j["start-time"])} · ${fmtDuration(j.duration)}
      · restarts ${j["num-restarts"] ?? 0}</span>
      ${running ? `<button class="danger" id="cancel-job">Cancel job</button>` : ""}</div>
    <div id="graph">${graph(j)}</div>
    <div class="tabs">${tabs.join("")}</div><div id="tab-content"></div>`;
  const cancel = document.getElementById("cancel-job");
  if (cancel) {
    cancel.addEventListener("click", async () => {
      cancel.disabled = true;
      try {
        await api(`/jobs/${jid}?mode=cancel`, {method: "PATCH"});
        render();
      } catch (e) { showError(`cancel failed: ${e.message}`); cancel.disabled = false; }
    });
  }
  const content = document.getElementById("tab-content");
  if (tab === "exceptions") content.innerHTML = await exceptionsTab(jid);
  else if (tab === "checkpoints") content.innerHTML = await checkpointsTab(jid, j.checkpointing);
  else if (tab === "spark") content.innerHTML = await sparkTab(jid);
  else content.innerHTML = await subtasksTab(jid, j.vertices);
}

// The job graph: vertices in columns by their distance from the sources, edges as curves.
function graph(j) {
  const nodes = j.plan.nodes;
  const byId = Object.fromEntries(j.vertices.map((v) => [v.id, v]));
  const level = {};
  const depth = (n, seen = new Set()) => {
    if (level[n.id] !== undefined) return level[n.id];
    if (seen.has(n.id)) return 0;
    seen.add(n.id);
    const ins = n.inputs.map((i) => nodes.find((m) => m.id === i.id)).filter(Boolean);
    level[n.id] = ins.length ? 1 + Math.max(...ins.map((m) => depth(m, seen))) : 0;
    return level[n.id];
  };
  nodes.forEach((n) => depth(n));
  const W = 250, H = 92, GX = 80, GY = 30, PAD = 20;
  const rows = {};
  const pos = {};
  nodes.forEach((n) => {
    const l = level[n.id];
    rows[l] = (rows[l] || 0) + 1;
    pos[n.id] = {x: PAD + l * (W + GX), y: PAD + (rows[l] - 1) * (H + GY)};
  });
  const width = PAD * 2 + (Math.max(0, ...Object.values(level)) + 1) * (W + GX) - GX;
  const height = PAD * 2 + Math.max(1, ...Object.values(rows)) * (H + GY) - GY;
  const edges = nodes.flatMap((n) => n.inputs.filter((i) => pos[i.id]).map((i) => {
    const a = pos[i.id], b = pos[n.id];
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    return `<path class="edge" d="M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2 - 6},${y2}" fill="none" stroke="#8a94a3"
        stroke-width="1.5" marker-end="url(#arrow)"/><text x="${mx}" y="${(y1 + y2) / 2 - 6}" text-anchor="middle"
        fill="#677585">${esc(i.ship_strategy)}</text>`;
  }));
  const boxes = nodes.map((n) => {
    const v = byId[n.id] || {metrics: {}, status: "CREATED", parallelism: n.parallelism, name: n.description};
    const m = v.metrics || {};
    const color = STATE_COLORS[v.status] || "#8a94a3";
    const {x, y} = pos[n.id];
    const name = v.name.length > 34 ? `${v.name.slice(0, 33)}…` : v.name;
    const bp = m["backpressured-time-ms-per-second"] || 0;
    return `<g class="vertex" data-vertex-id="${esc(n.id)}" data-status="${esc(v.status)}">
        <title>${esc(v.name)}</title>
        <rect x="${x}" y="${y}" width="${W}" height="${H}" rx="6" fill="#fff" stroke="${color}" stroke-width="2"/>
        <rect x="${x}" y="${y}" width="6" height="${H}" rx="3" fill="${color}"/>
        <text x="${x + 14}" y="${y + 20}" font-weight="600" class="vertex-name">${esc(name)}</text>
        <text x="${x + 14}" y="${y + 38}" fill="${color}">${esc(v.status)} · parallelism ${v.parallelism}</text>
        <text x="${x + 14}" y="${y + 56}" class="vertex-rates">in ${fmtRate(m["read-records-per-second"])}/s · out ${fmtRate(m["write-records-per-second"])}/s</text>
        <text x="${x + 14}" y="${y + 74}" class="vertex-backpressure">back-pressure ${esc(m["backpressure-level"] || "ok")} (${Math.round(bp)} ms/s)</text>
      </g>`;
  });
  return `<svg id="job-graph" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}">
      <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto">
      <path d="M0,0 L10,5 L0,10 z" fill="#8a94a3"/></marker></defs>${edges.join("")}${boxes.join("")}</svg>`;
}

async function subtasksTab(jid, vertices) {
  const details = await Promise.all(vertices.map((v) => api(`/jobs/${jid}/vertices/${v.id}`)));
  const rows = details.flatMap((d) => d.subtasks.map((s) => `<tr><td>${esc(d.name)}</td><td>${s.subtask + 1}/${d.parallelism}</td>
      <td>${state(s.status)}</td><td>${s.attempt}</td><td>${esc(s.endpoint)}</td>
      <td>${s.metrics["read-records"]}</td><td>${s.metrics["write-records"]}</td>
      <td>${fmtBytes(s.metrics["read-bytes"])}</td><td>${fmtBytes(s.metrics["write-bytes"])}</td>
      <td>${fmtRate(s.metrics["read-records-per-second"])}/s</td><td>${fmtRate(s.metrics["write-records-per-second"])}/s</td>
      <td>${Math.round(s.metrics["busy-time-ms-per-second"])}</td><td>${Math.round(s.metrics["backpressured-time-ms-per-second"])}</td>
      <td>${Math.round(s.metrics["idle-time-ms-per-second"])}</td></tr>`));
  return `<table id="subtasks-table"><thead><tr><th>Vertex</th><th>Subtask</th><th>State</th><th>Attempt</th>
      <th>TaskExecutor</th><th>Records in</th><th>Records out</th><th>Bytes in</th><th>Bytes out</th><th>In</th><th>Out</th>
      <th>Busy ms/s</th><th>Back-pressured ms/s</th><th>Idle ms/s</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

async function exceptionsTab(jid) {
  const e = await api(`/jobs/${jid}/exceptions`);
  const root = e["root-exception"] ? `<h3>Root cause</h3><pre id="root-exception">${esc(e["root-exception"])}</pre>` : "";
  const entries = e.exceptionHistory.entries;
  if (!entries.length && !root) return `<p class="muted" id="no-exceptions">No failures.</p>`;
  const rows = entries.map((x) => `<tr><td>${fmtTime(x.timestamp)}</td><td>${esc(x.taskName || "(job)")}</td>
      <td>${esc(x.exceptionName)}</td><td><pre>${esc(x.stacktrace)}</pre></td></tr>`);
  return `${root}<h3>Failure history</h3><table id="exceptions-table"><thead><tr><th>Time</th><th>Task</th>
      <th>Exception</th><th>Trace</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

async function checkpointsTab(jid, enabled) {
  if (!enabled) return `<p class="muted">This job takes no checkpoints.</p>`;
  const c = await api(`/jobs/${jid}/checkpoints`);
  const counts = c.counts;
  const rows = c.history.map((h) => `<tr><td>${h.id}</td><td>${esc(h.status)}</td><td>${h.unaligned ? "unaligned" : "aligned"}</td>
      <td>${fmtTime(h.trigger_timestamp)}</td><td>${h.end_to_end_duration} ms</td><td>${fmtBytes(h.state_size)}</td>
      <td>${h.alignment_duration} ms</td><td>${fmtBytes(h.persisted_data)}</td><td>${esc(h.failure_message || "")}</td></tr>`);
  return `<div class="cards">${card("Completed", counts.completed, "ck-completed")}${card("Failed", counts.failed, "ck-failed")}
      ${card("In progress", counts.in_progress, "ck-in-progress")}</div><h3>History</h3>
      <table id="checkpoints-table"><thead><tr><th>Id</th><th>Status</th><th>Type</th><th>Triggered</th><th>Duration</th>
      <th>Size</th><th>Alignment</th><th>In-flight data</th><th>Failure</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

async function sparkTab(jid) {
  const s = await api(`/jobs/${jid}/spark`);
  if (!s.stages.length) return `<p class="muted" id="no-spark">This job has no Spark stage that ran.</p>`;
  const rows = s.stages.map((r) => `<tr><td>${esc(r.stage)}</td><td>${esc(r.application_id)}</td><td>${esc(r.master)}</td>
      <td>${r.executors > 0 ? r.executors : "-"}</td><td>${r.jobs}</td><td>${r.stages}</td><td>${r.seconds} s</td>
      <td>${r.output_files}</td><td>${r.attempt}</td><td>${r.micro_batches ?? "-"}</td></tr>`);
  return `<table id="spark-table"><thead><tr><th>Stage</th><th>Spark application</th><th>Master</th><th>Executors</th>
      <th>Spark jobs</th><th>Spark stages</th><th>Last run</th><th>Output files</th><th>Attempt</th>
      <th>Micro-batches</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

async function taskmanagers(view, id) {
  if (id) {
    const tm = await api(`/taskmanagers/${encodeURIComponent(id)}`);
    const slots = tm.allocatedSlots.map((s) => `<tr><td>${s.index}</td><td>${esc(s.state)}</td>
        <td>${s.jobId ? `<a href="#/jobs/${esc(s.jobId)}">${esc(s.jobId)}</a>` : "-"}</td></tr>`);
    view.innerHTML = `<h2>TaskExecutor ${esc(tm.id)}</h2><p class="muted">${esc(tm.path)} · pid ${tm.pid} ·
        data ${esc(tm.dataAddress)} · last heartbeat ${fmtTime(tm.timeSinceLastHeartbeat)}</p>
        <table id="slots-table"><thead><tr><th>Slot</th><th>State</th><th>Job</th></tr></thead><tbody>${slots.join("")}</tbody></table>`;
    return;
  }
  const data = await api("/taskmanagers");
  const rows = data.taskmanagers.map((t) => `<tr class="link" data-href="#/taskmanagers/${esc(t.id)}"><td>${esc(t.id)}</td>
      <td>${esc(t.path)}</td><td>${t.slotsNumber}</td><td>${t.freeSlots}</td><td>${fmtTime(t.timeSinceLastHeartbeat)}</td></tr>`);
  view.innerHTML = `<h2>TaskExecutors</h2><table id="taskmanagers-table"><thead><tr><th>Id</th><th>Address</th>
      <th>Slots</th><th>Free</th><th>Last heartbeat</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
  bindRows(view);
}

// ---- routing ------------------------------------------------------------------------------------

async function render() {
  clearTimeout(timer);
  const parts = (location.hash.replace(/^#\/?/, "") || "overview").split("/");
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === parts[0]));
  const view = document.getElementById("view");
  try {
    if (parts[0] === "jobs" && parts[1]) await job(view, parts[1], parts[2]);
    else if (parts[0] === "jobs") await jobs(view);
    else if (parts[0] === "taskmanagers") await taskmanagers(view, parts[1]);
    else await overview(view);
    showError("");
  } catch (e) {
    showError(e.message);
  }
  timer = setTimeout(render, REFRESH_MS);
}

async function start() {
  try {
    const config = await api("/config");
    document.getElementById("cluster").textContent = `cluster ${config["cluster-id"]} · yarnflow ${config["flink-version"]}`;
  } catch (e) { showError(e.message); }
  window.addEventListener("hashchange", render);
  render();
}

start();
