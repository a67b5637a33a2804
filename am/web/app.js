// yarnflow web UI: plain JavaScript over the REST API (no build step, no CDN).
// Views (location hash): #/overview, #/jobs, #/jobs/<jid>[/<tab>], #/taskmanagers[/<id>], #/submit.
"use strict";

const REFRESH_MS = 2000;
const STATE_COLORS = {  // (as style.css's: readable on white)
  RUNNING: "#22703c", INITIALIZING: "#22703c", DEPLOYING: "#22703c", SCHEDULED: "#5d6877", CREATED: "#5d6877",
  RECONCILING: "#5d6877",
  FINISHED: "#4f5e6e", FAILED: "#b02f2f", CANCELING: "#865910", CANCELED: "#865910",
};
let timer = null;
let features = {};  // the server's (/config): a history server ("web-history") has archives only

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

// Every URL the page asks for is relative to it: behind a proxy that serves the UI under a
// prefix of its own (YARN's web proxy /proxy/<application id>/, skein's /pages/yarnflow/) the
// calls go through the same prefix. ("/jobs/x" is written as the REST path and asked as "jobs/x".)
function rel(path) { return path.replace(/^\//, ""); }

async function api(path, options) {
  const response = await fetch(rel(path), options);
  if (response.status === 401) {  // the REST API wants the cluster's token: sign in first
    location.href = `login${location.hash}`;  // (back to this view once signed in)
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

// ---- updating in place -------------------------------------------------------------------------
// Each refresh builds the page's HTML anew and morphs the live DOM into it: only what changed is
// touched, so the scroll position, an open stack trace (<details open>), a selection or a focused
// element survive the refresh (replacing the whole page reset them every few seconds).

function morph(live, html) {
  const next = document.createElement(live.tagName);
  next.innerHTML = html;
  morphChildren(live, next);
}

// Children with an id are matched by it (a row keeps its element, and so an opened trace, when
// rows are added above it); the others by position.
function morphChildren(live, next) {
  const b = [...next.childNodes];
  const byId = new Map([...live.childNodes].filter((n) => n.id).map((n) => [n.id, n]));
  const wanted = new Set(b.filter((n) => n.id).map((n) => n.id));
  b.forEach((nb, i) => {
    let na = live.childNodes[i];
    const keyed = nb.id ? byId.get(nb.id) : undefined;
    if (keyed && keyed !== na) { live.insertBefore(keyed, na || null); na = keyed; }
    if (!na) live.appendChild(nb);
    else if (nb.id && !keyed || na.id && wanted.has(na.id) && na.id !== nb.id) live.insertBefore(nb, na);
    else if (na.nodeType !== nb.nodeType || na.nodeName !== nb.nodeName || (na.id || "") !== (nb.id || "")) live.replaceChild(nb, na);
    else if (na.nodeType === Node.TEXT_NODE || na.nodeType === Node.COMMENT_NODE) {
      if (na.nodeValue !== nb.nodeValue) na.nodeValue = nb.nodeValue;
    } else morphElement(na, nb);
  });
  while (live.childNodes.length > b.length) live.removeChild(live.lastChild);
}

function morphElement(live, next) {
  for (const {name, value} of [...next.attributes]) if (live.getAttribute(name) !== value) live.setAttribute(name, value);
  for (const {name} of [...live.attributes]) {
    // "open" is the user's (a <details> they opened): kept
    if (!next.hasAttribute(name) && !(name === "open" && live.tagName === "DETAILS")) live.removeAttribute(name);
  }
  morphChildren(live, next);
}

// Clicks are handled once, on the page: rows link to their page, buttons act (the elements
// themselves outlive refreshes and must not collect a listener per refresh).
function onClick(event) {
  const row = event.target.closest("tr.link");
  if (row && !event.target.closest("a, summary, button")) location.hash = row.dataset.href;
  const cancel = event.target.closest("#cancel-job");
  if (cancel && !cancel.disabled && confirm(`Cancel job ${cancel.dataset.name}? Its tasks stop; unless it `
      + "keeps its checkpoints on cancellation, they are deleted.")) cancelJob(cancel);
  const operation = event.target.closest("button.job-action");
  if (operation && !operation.disabled) jobAction(operation);
  const all = event.target.closest("#log-all");
  if (all) { logState[all.dataset.log] = true; render(); }
  const sort = event.target.closest("button.sort");
  if (sort) {
    jobSort = {key: sort.dataset.sort, desc: jobSort.key === sort.dataset.sort ? !jobSort.desc : false};
    render();
  }
  const action = event.target.closest("#jar-upload, .jar-run, .jar-plan, .jar-delete");
  if (action && !action.disabled) onSubmitAction(action);
}

// Savepoint, stop-with-savepoint and rescale (Flink's REST operations): asked for what they need,
// then followed to their end; what they ended with stays shown on the job's page.
const jobActions = {};

async function follow(path, what) {
  for (let i = 0; i < 600; i++) {
    const s = await api(path);
    if (s.status.id === "COMPLETED") {
      const failure = s.operation && s.operation["failure-cause"];
      if (failure) throw new Error(`${what} failed: ${failure["stack-trace"]}`);
      return s.operation || {};
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`${what} did not end within 5 minutes (it may still)`);
}

async function jobAction(button) {
  const jid = button.dataset.jid;
  const say = (html) => { jobActions[jid] = html; const box = document.getElementById("job-action-result"); if (box) box.innerHTML = html; };
  try {
    if (button.id === "rescale-job") {
      const raw = prompt("New parallelism of the job's vertices:");
      if (raw === null) return;
      if (!/^[1-9][0-9]*$/.test(raw.trim())) throw new Error(`${raw} is not a parallelism (a whole number, 1 or more)`);
      button.disabled = true;
      say(`<p class="muted">Rescaling to ${esc(raw.trim())}…</p>`);
      const t = await api(`/jobs/${jid}/rescaling?parallelism=${raw.trim()}`, {method: "PATCH"});
      const done = await follow(`/jobs/${jid}/rescaling/${t["request-id"]}`, "the rescale");
      say(`<p class="ok">Rescaled to parallelism ${esc(done.parallelism ?? raw.trim())}.</p>`);
    } else {
      const stop = button.id === "stop-job";
      const dir = prompt(`${stop ? "Stop the job with a savepoint" : "Take a savepoint"} into which folder? `
        + "(empty: the cluster's state.savepoints.dir)", "");
      if (dir === null) return;
      if (stop && !confirm("Stop the job once the savepoint is taken?")) return;
      button.disabled = true;
      say(`<p class="muted">${stop ? "Stopping with a savepoint" : "Taking a savepoint"}…</p>`);
      const t = stop
        ? await api(`/jobs/${jid}/stop`, {method: "POST", headers: {"Content-Type": "application/json"},
          body: JSON.stringify(dir.trim() ? {targetDirectory: dir.trim(), drain: false} : {drain: false})})
        : await api(`/jobs/${jid}/savepoints`, {method: "POST", headers: {"Content-Type": "application/json"},
          body: JSON.stringify(dir.trim() ? {"target-directory": dir.trim(), "cancel-job": false} : {"cancel-job": false})});
      const done = await follow(`/jobs/${jid}/savepoints/${t["request-id"]}`, "the savepoint");
      say(`<p class="ok" id="savepoint-location">Savepoint written to <code>${esc(done.location)}</code>${stop
        ? "; the job stopped" : ""}.</p>`);
    }
  } catch (e) {
    say(`<p class="error" role="alert">${esc(e.message)}</p>`);
  } finally {
    button.disabled = false;
    render();
  }
}

async function cancelJob(button) {
  button.disabled = true;
  try {
    await api(`/jobs/${button.dataset.jid}?mode=cancel`, {method: "PATCH"});
    render();
  } catch (e) { showError(`cancel failed: ${e.message}`); button.disabled = false; }
}

// A stack trace, folded under its headline (by default its first line; an exception's own
// "Type: message" when given, which a Python trace prints last).
function trace(text, headline) {
  const first = headline || String(text || "").split("\n").find((l) => l.trim()) || "";
  return `<details class="trace"><summary>${esc(first.length > 600 ? `${first.slice(0, 599)}…` : first)}</summary>
      <pre>${esc(text)}</pre></details>`;
}

// "Type: message" of a failure: the exception's type and message, else a Python trace's last line.
function headline(name, message, text) {
  if (message) return `${name ? `${name}: ` : ""}${message}`;
  const last = String(text || "").split("\n").filter((l) => l.trim()).pop() || "";
  return last || name || "";
}

function hashOf(text) {  // a short stable key for an entry (its element keeps its state across refreshes)
  let h = 0;
  for (let i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) | 0;
  return (h >>> 0).toString(36);
}

function backpressure(level, ms) {
  return `<span class="bp bp-${esc(level || "ok")}">${esc(level || "ok")}${ms !== undefined ? ` (${Math.round(ms)} ms/s)` : ""}</span>`;
}

// ---- views ------------------------------------------------------------------------------------

async function overview() {
  const [o, jobs] = await Promise.all([api("/overview"), api("/jobs/overview")]);
  return `<h2>Overview</h2><div class="cards">
      ${card("TaskExecutors", o.taskmanagers, "card-taskmanagers")}
      ${card("Slots total", o["slots-total"], "card-slots-total")}
      ${card("Slots free", o["slots-available"], "card-slots-available")}
      ${card("Running jobs", o["jobs-running"], "card-jobs-running")}
      ${card("Finished jobs", o["jobs-finished"], "card-jobs-finished")}
      ${card("Failed jobs", o["jobs-failed"], "card-jobs-failed")}
      ${card("Canceled jobs", o["jobs-cancelled"], "card-jobs-cancelled")}
    </div>${jobLists(jobs.jobs)}`;
}

// Running and completed jobs in lists of their own (as Flink's), filtered by the search box and
// sorted by the column chosen; a job's name is a link (keyboard, middle click, a new tab).
const ENDED = ["FINISHED", "FAILED", "CANCELED", "SUSPENDED"];
let jobSort = {key: "start-time", desc: true};

function jobLists(all) {
  const box = document.getElementById("job-search");
  const typed = box ? box.value : "";
  const query = typed.trim().toLowerCase();
  const shown = all.filter((j) => !query || j.name.toLowerCase().includes(query) || j.jid.includes(query)
    || j.state.toLowerCase().includes(query));
  const value = (j) => jobSort.key === "tasks" ? j.tasks.running : j[jobSort.key];
  shown.sort((a, b) => {
    const x = value(a), y = value(b);
    const order = typeof x === "string" ? x.localeCompare(y) : x - y;
    return jobSort.desc ? -order : order;
  });
  const search = `<div class="toolbar"><label for="job-search">Search jobs</label>
    <input id="job-search" type="search" placeholder="name, id or state" value="${esc(typed)}"></div>`;
  return `${search}<h3>Running jobs</h3>${jobTable(shown.filter((j) => !ENDED.includes(j.state)), "running-jobs",
    query ? "No running job matches." : "No job is running.")}
    <h3>Completed jobs</h3>${jobTable(shown.filter((j) => ENDED.includes(j.state)), "completed-jobs",
    query ? "No completed job matches." : "No job has ended yet.")}`;
}

function jobTable(jobs, id, empty) {
  if (!jobs.length) return `<p class="muted" id="${id}-none">${esc(empty)}</p>`;
  const header = (key, label) => {
    const sorted = jobSort.key === key;
    return `<th aria-sort="${sorted ? (jobSort.desc ? "descending" : "ascending") : "none"}"><button class="sort"
      data-sort="${key}">${label}${sorted ? (jobSort.desc ? " ▼" : " ▲") : ""}</button></th>`;
  };
  const rows = jobs.map((j) => `<tr class="link" id="${id}-${esc(j.jid)}" data-href="#/jobs/${esc(j.jid)}">
      <td><a class="job-link" href="#/jobs/${esc(j.jid)}">${esc(j.name)}</a></td><td>${state(j.state)}</td>
      <td>${fmtTime(j["start-time"])}</td><td>${fmtDuration(j.duration)}</td><td>${j.tasks.running}/${j.tasks.total}</td>
      <td class="muted">${esc(j.jid)}</td></tr>`);
  return `<table id="${id}" class="jobs-table"><thead><tr>${header("name", "Name")}${header("state", "State")}
      ${header("start-time", "Started")}${header("duration", "Duration")}${header("tasks", "Tasks running")}
      <th>Id</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

async function jobs() {
  const data = await api("/jobs/overview");
  return `<h2>Jobs</h2>${jobLists(data.jobs)}`;
}

async function job(jid, tab, detail, extra) {
  let j;
  try {
    j = await api(`/jobs/${jid}`);
  } catch (e) {  // (an unknown job: said on its page, under the header, with the way back)
    if (!e.message.startsWith("404")) throw e;
    return `<h2>Job ${esc(jid)}</h2><p class="error" id="job-missing" role="alert">${esc(e.message)}</p>
      <p><a href="#/jobs">All jobs</a></p>`;
  }
  const running = !["FINISHED", "FAILED", "CANCELED", "SUSPENDED"].includes(j.state);
  tab = tab || "subtasks";
  const history = !!features["web-history"];  // flame graphs sample running tasks: none in an archive
  const tabs = ["subtasks", "exceptions", "checkpoints", "flamegraph", "configuration", "spark"]
    .filter((t) => !(history && t === "flamegraph")).map((t) =>
    `<a href="#/jobs/${esc(jid)}/${t}" class="${t === tab ? "active" : ""}" id="tab-${t}">${t[0].toUpperCase() + t.slice(1)}</a>`);
  let content;
  try {  // a tab that cannot be shown says why in its place: the job's header and tabs stay
    content = tab === "vertex" ? await vertexPanel(jid, detail, j)
      : tab === "exceptions" ? await exceptionsTab(jid)
      : tab === "checkpoints" ? await checkpointsTab(jid, j.checkpointing, detail, j.vertices)
      : tab === "spark" ? await sparkTab(jid)
      : tab === "configuration" ? await configurationTab(jid)
      : tab === "flamegraph" && history ? `<p class="muted" id="flame-status">Flame graphs are sampled from a running
          job's tasks: the history server has only the job's archive.</p>`
      : tab === "flamegraph" ? await flameGraphTab(jid, j.vertices, detail, extra)
      : await subtasksTab(jid, j.vertices);
  } catch (e) {
    content = `<p class="error" id="tab-error" role="alert">${esc(e.message)}</p>`;
  }
  return `<div class="toolbar"><h2>${esc(j.name)}</h2>${state(j.state)}
      <span class="muted">${esc(j.jid)} · started ${fmtTime(j["start-time"])} · ${fmtDuration(j.duration)}
      · restarts ${j["num-restarts"] ?? 0}</span>
      ${running && !history ? `<button id="savepoint-job" class="job-action" data-jid="${esc(jid)}">Savepoint</button>
        <button id="stop-job" class="job-action" data-jid="${esc(jid)}">Stop with savepoint</button>
        <button id="rescale-job" class="job-action" data-jid="${esc(jid)}">Rescale</button>
        <button class="danger" id="cancel-job" data-jid="${esc(jid)}"
        data-name="${esc(j.name)}">Cancel job</button>` : ""}</div>
    <div id="job-action-result" role="status">${jobActions[jid] || ""}</div>
    <div id="graph">${graph(j)}</div>
    <div class="tabs">${tabs.join("")}</div><div id="tab-content">${content}</div>`;
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
  const W = 250, H = 92, GX = 120, GY = 30, PAD = 20;
  // rows: a column's vertices in the order of where their inputs are (fewer crossing edges)
  const columns = {};
  nodes.forEach((n) => (columns[level[n.id]] = columns[level[n.id]] || []).push(n));
  const rowOf = {};
  Object.keys(columns).map(Number).sort((a, b) => a - b).forEach((l) => {
    const at = (n) => {
      const ins = n.inputs.filter((i) => rowOf[i.id] !== undefined).map((i) => rowOf[i.id]);
      return ins.length ? ins.reduce((a, b) => a + b, 0) / ins.length : 0;
    };
    columns[l].map((n, k) => ({n, k, at: at(n)})).sort((a, b) => a.at - b.at || a.k - b.k)
      .forEach(({n}, r) => { rowOf[n.id] = r; });
  });
  const pos = {};
  nodes.forEach((n) => { pos[n.id] = {x: PAD + level[n.id] * (W + GX), y: PAD + rowOf[n.id] * (H + GY)}; });
  const rows = Object.values(columns).map((c) => c.length);
  const width = PAD * 2 + (Math.max(0, ...Object.values(level)) + 1) * (W + GX) - GX;
  const height = PAD * 2 + Math.max(1, ...rows) * (H + GY) - GY;
  // Each edge leaves its source and enters its target at a point of its own (spread along the
  // box's side: inputs no longer meet in one point, where their labels hid one another). An
  // edge between neighbouring columns is a curve; one that skips columns runs along the gap
  // above the boxes in between (it ran under them). Its label (the ship strategy) sits on the
  // edge near its target, on a white ground.
  const outs = {};
  nodes.forEach((n) => n.inputs.forEach((i) => (outs[i.id] = outs[i.id] || []).push(n.id)));
  const exitY = (from, to) => {
    const list = (outs[from] || []).slice().sort((a, b) => pos[a].y - pos[b].y);
    return pos[from].y + H * (list.indexOf(to) + 1) / (list.length + 1);
  };
  const entryY = (n, i) => {
    const list = n.inputs.filter((x) => pos[x.id]).sort((a, b) => pos[a.id].y - pos[b.id].y);
    return pos[n.id].y + H * (list.indexOf(i) + 1) / (list.length + 1);
  };
  const overlaps = (n, l, top, bottom) => level[n.id] === l && pos[n.id].y < bottom && pos[n.id].y + H > top;
  const edges = nodes.flatMap((n) => n.inputs.filter((i) => pos[i.id]).map((i) => {
    const a = pos[i.id], b = pos[n.id];
    const x1 = a.x + W, y1 = exitY(i.id, n.id), x2 = b.x, y2 = entryY(n, i), mx = (x1 + x2) / 2;
    let d = `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2 - 6},${y2}`;
    const between = [];
    for (let l = level[i.id] + 1; l < level[n.id]; l++) between.push(l);
    const blocked = nodes.filter((m) => between.some((l) => overlaps(m, l, Math.min(y1, y2) - 8, Math.max(y1, y2) + 8)));
    let lx = x2 - GX / 2, ly = y2;
    if (blocked.length) {
      const lane = Math.min(...blocked.map((m) => pos[m.id].y)) - GY / 2;
      const q = GX / 2;
      d = `M${x1},${y1} C${x1 + q},${y1} ${x1 + q},${lane} ${x1 + GX},${lane} L${x2 - GX},${lane}
          C${x2 - q},${lane} ${x2 - q},${y2} ${x2 - 6},${y2}`;
      lx = x2 - GX - 40; ly = lane;
    } else {
      ly = y1 + 0.65 * (y2 - y1);  // the curve's point 60% along: past any crossing, clear of the box
      lx = mx + 0.08 * GX;
    }
    const label = esc(i.ship_strategy);
    const w = label.length * 7 + 8;
    return `<g class="edge-group" data-from="${esc(i.id)}" data-to="${esc(n.id)}" data-strategy="${label}">
        <path class="edge" d="${d}" fill="none" stroke="#8a94a3" stroke-width="1.5" marker-end="url(#arrow)"/>
        <rect x="${lx - w / 2}" y="${ly - 9}" width="${w}" height="16" rx="3" fill="#fff" opacity="0.9"/>
        <text class="edge-label" x="${lx}" y="${ly + 3}" text-anchor="middle" fill="#4d5b6a">${label}</text></g>`;
  }));
  const boxes = nodes.map((n) => {
    const v = byId[n.id] || {metrics: {}, status: "CREATED", parallelism: n.parallelism, name: n.description};
    const m = v.metrics || {};
    const color = STATE_COLORS[v.status] || "#5d6877";
    const {x, y} = pos[n.id];
    const name = v.name.length > 34 ? `${v.name.slice(0, 33)}…` : v.name;
    const bp = m["backpressured-time-ms-per-second"] || 0;
    return `<a href="#/jobs/${esc(j.jid)}/vertex/${esc(n.id)}" class="vertex-link" aria-label="vertex ${esc(v.name)}">
        <g class="vertex" data-vertex-id="${esc(n.id)}" data-status="${esc(v.status)}">
        <title>${esc(v.name)}</title>
        <rect x="${x}" y="${y}" width="${W}" height="${H}" rx="6" fill="#fff" stroke="${color}" stroke-width="2"/>
        <rect x="${x}" y="${y}" width="6" height="${H}" rx="3" fill="${color}"/>
        <text x="${x + 14}" y="${y + 20}" font-weight="600" class="vertex-name">${esc(name)}</text>
        <text x="${x + 14}" y="${y + 38}" fill="${color}">${esc(v.status)} · parallelism ${v.parallelism}</text>
        <text x="${x + 14}" y="${y + 56}" class="vertex-rates">in ${fmtRate(m["read-records-per-second"])}/s · out ${fmtRate(m["write-records-per-second"])}/s</text>
        <text x="${x + 14}" y="${y + 74}" class="vertex-backpressure bp-${esc(m["backpressure-level"] || "ok")}">back-pressure ${esc(m["backpressure-level"] || "ok")} (${Math.round(bp)} ms/s)</text>
      </g></a>`;
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
      <td>${Math.round(s.metrics["busy-time-ms-per-second"])}</td><td>${backpressure(s.metrics["backpressure-level"], s.metrics["backpressured-time-ms-per-second"])}</td>
      <td>${Math.round(s.metrics["idle-time-ms-per-second"])}</td></tr>`));
  return `<table id="subtasks-table"><thead><tr><th>Vertex</th><th>Subtask</th><th>State</th><th>Attempt</th>
      <th>TaskExecutor</th><th>Records in</th><th>Records out</th><th>Bytes in</th><th>Bytes out</th><th>In</th><th>Out</th>
      <th>Busy ms/s</th><th>Back-pressure</th><th>Idle ms/s</th></tr></thead><tbody>${rows.join("")}</tbody></table>
      <p class="muted" id="rates-note">Rates and times per second are measured over the last 5 seconds. Records are
      counted as they are processed (a slow function's batch slice by slice); waiting for room downstream is
      back-pressure, waiting for input is idle.</p>`;
}

// Failures newest first, each with its exception's type and message in view (as Flink's list
// shows them) and its trace folded below; an opened trace stays open, on its own entry, as new
// failures arrive above it.
async function exceptionsTab(jid) {
  const e = await api(`/jobs/${jid}/exceptions`);
  const entries = e.exceptionHistory.entries;
  const root = e["root-exception"] ? `<h3>Root cause</h3><div id="root-exception">${trace(e["root-exception"],
    headline("", "", e["root-exception"]))}</div>` : "";
  if (!entries.length && !root) return `<p class="muted" id="no-exceptions">No failures.</p>`;
  const rows = entries.map((x) => `<tr id="exc-${x.timestamp}-${hashOf(`${x.taskName}|${x.stacktrace}`)}">
      <td class="nowrap">${fmtTime(x.timestamp)}</td><td class="exc-task">${esc(x.taskName || "(job)")}</td>
      <td class="nowrap">${esc(x.taskManagerId || "-")}</td>
      <td class="exc-what">${trace(x.stacktrace, headline(x.exceptionName, x.exceptionMessage, x.stacktrace))}</td></tr>`);
  return `${root}<h3>Failure history</h3><table id="exceptions-table"><thead><tr><th>Time</th><th>Task</th>
      <th>TaskExecutor</th><th>Exception (open for its trace)</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

// A vertex's panel (a click on it in the graph): its subtasks and where they run, watermarks,
// back-pressure, accumulators, and charts of its rates since the panel opened (sampled at each
// refresh, as Flink's dashboard charts them).
const series = {};  // "jid/vid" -> [[time, in/s, out/s, back-pressured ms/s]]
const SERIES_KEPT = 300;

function chart(points, pick, label, unit) {
  const W = 360, H = 90, P = 4;
  const values = points.map(pick);
  const top = Math.max(1, ...values);
  const xs = (i) => P + (points.length > 1 ? i * (W - 2 * P) / (points.length - 1) : 0);
  const ys = (v) => H - P - v / top * (H - 2 * P);
  const path = values.map((v, i) => `${i ? "L" : "M"}${xs(i).toFixed(1)},${ys(v).toFixed(1)}`).join(" ");
  const last = values.length ? values[values.length - 1] : 0;
  return `<figure class="chart"><figcaption>${esc(label)}: ${fmtRate(last)}${unit} <span class="muted">(max ${fmtRate(top)})</span></figcaption>
    <svg width="${W}" height="${H}" role="img" aria-label="${esc(label)} over the last ${points.length} samples">
    <rect x="0" y="0" width="${W}" height="${H}" fill="#fff" stroke="#d8dee6"/>
    <path d="${path}" fill="none" stroke="#245a94" stroke-width="1.5"/></svg></figure>`;
}

async function vertexPanel(jid, vid, j) {
  const vertex = j.vertices.find((v) => v.id === vid);
  if (!vertex) return `<p class="error" role="alert">No vertex ${esc(vid)} in this job.</p>`;
  const base = `/jobs/${jid}/vertices/${vid}`;
  const history = !!features["web-history"];
  const [d, tms, bp, wm, acc] = await Promise.all([api(base), api(`${base}/taskmanagers`),
    api(`${base}/backpressure`), api(`${base}/watermarks`).catch(() => []), api(`${base}/accumulators`).catch(() => null)]);
  const m = vertex.metrics || {};
  const key = `${jid}/${vid}`;
  const points = series[key] = series[key] || [];
  if (!history) {
    points.push([Date.now(), m["read-records-per-second"] || 0, m["write-records-per-second"] || 0,
      m["backpressured-time-ms-per-second"] || 0]);
    if (points.length > SERIES_KEPT) points.shift();
  }
  const subtasks = d.subtasks.map((s, i) => {
    const b = bp.subtasks.find((x) => x.subtask === s.subtask) || {};
    const w = wm.find((x) => x.id === `${s.subtask}.currentInputWatermark`);
    return `<tr><td>${s.subtask + 1}/${d.parallelism}</td><td>${state(s.status)}</td><td>${s.attempt}</td>
      <td><a href="#/taskmanagers/${esc(s["taskmanager-id"])}">${esc(s["taskmanager-id"])}</a></td>
      <td>${s.metrics["read-records"]}</td><td>${s.metrics["write-records"]}</td>
      <td>${backpressure(b["backpressure-level"], b.ratio !== undefined ? b.ratio * 1000 : undefined)}</td>
      <td>${w ? fmtTime(Number(w.value)) : "-"}</td></tr>`;
  });
  const places = tms.taskmanagers.map((t) => `<tr><td><a href="#/taskmanagers/${esc(t["taskmanager-id"])}">${esc(t["taskmanager-id"])}</a></td>
      <td>${esc(t.host)}</td><td>${state(t.status)}</td><td>${t.metrics["read-records"]}</td><td>${t.metrics["write-records"]}</td></tr>`);
  const accumulators = acc && acc["user-accumulators"] && acc["user-accumulators"].length
    ? `<ul>${acc["user-accumulators"].map((a) => `<li>${esc(a.name)}: ${esc(a.value)}</li>`).join("")}</ul>`
    : `<p class="muted">No accumulators (yarnflow's jobs keep none).</p>`;
  const charts = history ? `<p class="muted">Charts follow a running job.</p>` : `<div class="charts" id="vertex-charts">
      ${chart(points, (p) => p[1], "Records in", "/s")}${chart(points, (p) => p[2], "Records out", "/s")}
      ${chart(points, (p) => p[3], "Back-pressured", " ms/s")}</div>`;
  return `<h3 id="vertex-name">${esc(vertex.name)}</h3><p class="muted">parallelism ${vertex.parallelism} · ${state(vertex.status)}
      · <a href="#/jobs/${esc(jid)}/subtasks">all vertices</a></p>${charts}
    <h3>Subtasks</h3><table id="vertex-subtasks"><thead><tr><th>Subtask</th><th>State</th><th>Attempt</th><th>TaskExecutor</th>
      <th>Records in</th><th>Records out</th><th>Back-pressure</th><th>Input watermark</th></tr></thead>
      <tbody>${subtasks.join("")}</tbody></table>
    <h3>TaskExecutors</h3><table id="vertex-taskmanagers"><thead><tr><th>TaskExecutor</th><th>Host</th><th>State</th>
      <th>Records in</th><th>Records out</th></tr></thead><tbody>${places.join("")}</tbody></table>
    <h3>Accumulators</h3>${accumulators}`;
}

// A flame graph (Flink's): each frame a bar as wide as the samples whose stacks pass through it,
// the callers below their callees' row; one row per stack depth.
async function flameGraphTab(jid, vertices, vid, kind) {
  vid = vid || (vertices[0] && vertices[0].id);
  kind = kind || "FULL";
  if (!vid) return `<p class="muted">No vertex.</p>`;
  const pick = vertices.map((v) => `<a href="#/jobs/${esc(jid)}/flamegraph/${esc(v.id)}/${kind}"
      class="${v.id === vid ? "active" : ""}">${esc(v.name)}</a>`).join(" · ");
  const kinds = ["FULL", "ON_CPU", "OFF_CPU"].map((k) => `<a href="#/jobs/${esc(jid)}/flamegraph/${esc(vid)}/${k}"
      class="${k === kind ? "active" : ""}" id="flame-${k}">${{FULL: "All", ON_CPU: "On CPU", OFF_CPU: "Off CPU"}[k]}</a>`).join(" · ");
  const g = await api(`/jobs/${jid}/vertices/${vid}/flamegraph?type=${kind}`);
  const status = {"-1": "None of its tasks runs: nothing to sample.", "-2": "Flame graphs are off (rest.flamegraph.enabled).",
    "-3": "Sampling its tasks' threads…"}[String(g.endTimestamp)];
  let body;
  if (status) body = `<p class="muted" id="flame-status">${esc(status)}</p>`;
  else if (!g.data || !g.data.value) body = `<p class="muted" id="flame-status">No ${esc(kind)} samples.</p>`;
  else {
    const rows = [];
    const walk = (node, depth, left) => {
      const width = node.value / g.data.value * 100;
      if (width < 0.3) return;
      (rows[depth] = rows[depth] || []).push(`<div class="flame" style="left:${left}%;width:${width}%"
          title="${esc(node.name)}: ${node.value} samples (${width.toFixed(1)}%)">${esc(node.name)}</div>`);
      let at = left;
      for (const c of node.children) { walk(c, depth + 1, at); at += c.value / g.data.value * 100; }
    };
    walk(g.data, 0, 0);
    body = `<p class="muted" id="flame-status">${g.data.value} samples, taken ${fmtTime(g.endTimestamp)}</p>
      <div id="flamegraph">${rows.reverse().map((r) => `<div class="flame-row">${r.join("")}</div>`).join("")}</div>`;
  }
  return `<p>${pick}</p><p>${kinds}</p>${body}`;
}

async function threadDump(id) {
  const d = await api(`/taskmanagers/${encodeURIComponent(id)}/thread-dump`);
  const rows = d.threadInfos.map((t) => `<tr><td>${esc(t.threadName)}</td><td>${trace(t.stringifiedThreadInfo)}</td></tr>`);
  return `<h2>Thread dump of TaskExecutor ${esc(id)}</h2><p><a href="#/taskmanagers/${esc(id)}">back</a></p>
      <table id="thread-dump"><thead><tr><th>Thread</th><th>Stack</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

async function checkpointDetail(jid, cid, vertices) {
  const parts = await Promise.all(vertices.map((v) => api(`/jobs/${jid}/checkpoints/details/${cid}/subtasks/${v.id}`)
    .then((d) => ({v, d})).catch((e) => ({v, error: e.message}))));
  const rows = parts.flatMap(({v, d, error}) => error ? [`<tr><td>${esc(v.name)}</td><td colspan="9" class="muted">${esc(error)}</td></tr>`]
    : d.subtasks.map((s) => s.status === "finished" ? `<tr><td>${esc(v.name)}</td><td>${s.index + 1}</td>
      <td>finished</td><td colspan="7" class="muted">had finished before the checkpoint: in it as finished</td></tr>`
    : `<tr><td>${esc(v.name)}</td><td>${s.index + 1}</td><td>${esc(s.status)}</td>
      <td>${s.ack_timestamp ? fmtTime(s.ack_timestamp) : "-"}</td><td>${s.end_to_end_duration ?? "-"} ms</td>
      <td>${s.state_size !== undefined ? fmtBytes(s.state_size) : "-"}</td>
      <td>${s.checkpoint ? `${s.checkpoint.sync} ms / ${s.checkpoint.async} ms` : "-"}</td>
      <td>${s.alignment ? s.alignment.duration : "-"} ms</td><td>${s.start_delay ?? "-"} ms</td>
      <td>${s.unaligned_checkpoint ? `unaligned, ${fmtBytes(s.alignment.persisted)} in flight` : "aligned"}</td></tr>`));
  return `<h3>Checkpoint ${esc(cid)} per subtask</h3><table id="checkpoint-subtasks"><thead><tr><th>Vertex</th><th>Subtask</th>
      <th>Status</th><th>Acknowledged</th><th>Duration</th><th>State</th><th>Sync / async</th><th>Alignment</th>
      <th>Start delay</th><th>Kind</th></tr></thead>
      <tbody>${rows.join("")}</tbody></table>`;
}

async function checkpointsTab(jid, enabled, detail, vertices) {
  if (!enabled) return `<p class="muted">This job takes no checkpoints.</p>`;
  const c = await api(`/jobs/${jid}/checkpoints`);
  const counts = c.counts;
  const rows = c.history.map((h) => `<tr class="link" data-href="#/jobs/${esc(jid)}/checkpoints/${h.id}"><td>${h.id}</td><td>${esc(h.status)}</td>
      <td>${h.is_savepoint ? "savepoint" : h.unaligned ? "unaligned" : "aligned"}</td>
      <td>${h.num_acknowledged_subtasks}/${h.num_subtasks}</td>
      <td>${fmtTime(h.trigger_timestamp)}</td><td>${h.end_to_end_duration} ms</td><td>${fmtBytes(h.state_size)}</td>
      <td>${h.alignment_duration} ms</td><td>${h.start_delay} ms</td><td>${fmtBytes(h.persisted_data)}</td>
      <td class="muted">${esc(h.external_path || "")}${h.discarded ? " (discarded)" : ""}</td>
      <td>${esc(h.failure_message || "")}</td></tr>`);
  const restored = c.latest.restored ? `<p class="muted" id="ck-restored">Last restored from checkpoint
      ${c.latest.restored.id} at ${fmtTime(c.latest.restored.restore_timestamp)}</p>` : "";
  const latest = (label, h, more) => `<tr><th scope="row">${label}</th>${h ? `<td>${h.id}</td><td>${fmtTime(h.trigger_timestamp)}</td>
      <td>${more(h)}</td>` : `<td colspan="3" class="muted">none</td>`}</tr>`;
  const where = (h) => `${esc(h.external_path || "")}${h.discarded ? " (discarded)" : ""}`;
  const overview = `<h3>Latest</h3><table id="checkpoint-latest"><thead><tr><th></th><th>Id</th><th>Triggered</th>
      <th></th></tr></thead><tbody>
      ${latest("Completed", c.latest.completed, (h) => `${h.end_to_end_duration} ms, ${fmtBytes(h.state_size)} · ${where(h)}`)}
      ${latest("Savepoint", c.latest.savepoint, where)}
      ${latest("Failed", c.latest.failed, (h) => esc(h.failure_message || ""))}
      ${c.latest.restored ? `<tr><th scope="row">Restored</th><td>${c.latest.restored.id}</td>
        <td>${fmtTime(c.latest.restored.restore_timestamp)}</td><td>${c.latest.restored.is_savepoint ? "savepoint" : "checkpoint"}
        ${esc(c.latest.restored.external_path || "")}</td></tr>` : `<tr><th scope="row">Restored</th><td colspan="3" class="muted">never</td></tr>`}
      </tbody></table>`;
  const stat = (label, x, fmt) => `<tr><th scope="row">${label}</th><td>${fmt(x.min)}</td><td>${fmt(x.avg)}</td>
      <td>${fmt(x.p99)}</td><td>${fmt(x.max)}</td></tr>`;
  const ms = (v) => `${v} ms`;
  const summary = counts.completed ? `<h3>Summary of the completed checkpoints kept</h3><table id="checkpoint-summary">
      <thead><tr><th></th><th>Minimum</th><th>Average</th><th>99th percentile</th><th>Maximum</th></tr></thead><tbody>
      ${stat("End to end duration", c.summary.end_to_end_duration, ms)}${stat("State size", c.summary.state_size, fmtBytes)}
      ${stat("Alignment", c.summary.alignment_duration, ms)}${stat("Start delay", c.summary.start_delay, ms)}
      ${stat("In-flight data", c.summary.persisted_data, fmtBytes)}
      </tbody></table>` : "";
  return `<div class="cards">${card("Completed", counts.completed, "ck-completed")}${card("Failed", counts.failed, "ck-failed")}
      ${card("In progress", counts.in_progress, "ck-in-progress")}${card("Restored", counts.restored, "ck-restored-count")}</div>
      ${restored}${detail ? await checkpointDetail(jid, detail, vertices) : ""}${overview}${summary}<h3>History</h3>
      <table id="checkpoints-table"><thead><tr><th>Id</th><th>Status</th><th>Type</th><th>Acknowledged</th><th>Triggered</th>
      <th>Duration</th><th>Size</th><th>Alignment</th><th>Start delay</th><th>In-flight data</th><th>Location</th>
      <th>Failure</th></tr></thead>
      <tbody>${rows.join("")}</tbody></table>`;
}

async function configurationTab(jid) {
  const [config, checkpoints] = await Promise.all([api(`/jobs/${jid}/jobmanager/config`),
    api(`/jobs/${jid}/checkpoints/config`).catch(() => null)]);
  const rows = config.map((e) => `<tr><td>${esc(e.key)}</td><td>${esc(e.value)}</td></tr>`);
  const ck = checkpoints ? `<p class="muted" id="checkpoint-config">Checkpoints: ${esc(checkpoints.mode)} every
      ${checkpoints.interval} ms, timeout ${checkpoints.timeout} ms, ${checkpoints.unaligned_checkpoints ? "unaligned" : "aligned"},
      state backend ${esc(checkpoints.state_backend)}</p>` : `<p class="muted">This job takes no checkpoints.</p>`;
  return `${ck}<table id="config-table"><thead><tr><th>Key</th><th>Value</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
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

async function taskmanagers(id) {
  if (id) {
    const [tm, logs] = await Promise.all([api(`/taskmanagers/${encodeURIComponent(id)}`),
      api(`/taskmanagers/${encodeURIComponent(id)}/logs`)]);
    const slots = tm.allocatedSlots.map((s) => `<tr><td>${s.index}</td><td>${esc(s.state)}</td>
        <td>${s.jobId ? `<a href="#/jobs/${esc(s.jobId)}">${esc(s.jobId)}</a>` : "-"}</td></tr>`);
    const m = tm.memory;
    const memory = m ? `<div class="cards">${card("Memory used", fmtBytes(m.used), "tm-memory-used")}
        ${card("Peak", fmtBytes(m.peak), "tm-memory-peak")}${card("Limit", fmtBytes(m.limit), "tm-memory-limit")}
        ${card("Managed used", fmtBytes(m.managedUsed), "tm-managed-used")}${card("Level", m.level, "tm-memory-level")}
        ${card("CPU", `${Math.round((m.cpuLoad || 0) * 100)}%`, "tm-cpu")}</div>` : "";
    const files = logs.logs.map((f) => `<li><a href="#/logs/taskmanager/${encodeURIComponent(id)}/${encodeURIComponent(f.name)}"
        >${esc(f.name)}</a> <span class="muted">${fmtBytes(f.size)}</span></li>`);
    const worker = tm.worker && tm.worker !== tm.id ? `slot process of worker ${esc(tm.worker)} · ` : "";
    return `<h2>TaskExecutor ${esc(tm.id)}</h2><p class="muted">${worker}${esc(tm.path)} · pid ${tm.pid} ·
        data ${esc(tm.dataAddress)} · last heartbeat ${fmtTime(tm.timeSinceLastHeartbeat)} ·
        <a href="#/taskmanagers/${esc(tm.id)}/thread-dump" id="tm-thread-dump">thread dump</a></p>${memory}
        <table id="slots-table"><thead><tr><th>Slot</th><th>State</th><th>Job</th></tr></thead><tbody>${slots.join("")}</tbody></table>
        <h3>Logs</h3>${files.length ? `<ul id="tm-logs">${files.join("")}</ul>` :
          `<p class="muted" id="tm-logs">Its log files are on its own host (YARN keeps them: yarn logs).</p>`}`;
  }
  const data = await api("/taskmanagers");
  if (!data.taskmanagers.length) {
    return `<h2>TaskExecutors</h2><p class="muted" id="no-taskmanagers">${features["web-history"]
      ? "The history server shows ended jobs from their archives: it has no TaskExecutors. A job's page lists where each of its subtasks ran."
      : "No TaskExecutor is registered: the cluster starts them as jobs need slots (or they are still starting)."}</p>`;
  }
  const rows = data.taskmanagers.map((t) => `<tr class="link" data-href="#/taskmanagers/${esc(t.id)}"><td>${esc(t.id)}</td>
      <td>${esc(t.path)}</td><td>${t.slotsNumber}</td><td>${t.freeSlots}</td>
      <td>${t.memory ? fmtBytes(t.memory.used) : "-"}</td><td>${fmtTime(t.timeSinceLastHeartbeat)}</td></tr>`);
  return `<h2>TaskExecutors</h2><table id="taskmanagers-table"><thead><tr><th>Id</th><th>Address</th>
      <th>Slots</th><th>Free</th><th>Memory</th><th>Last heartbeat</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

// ---- the AppMaster's page and the log viewer -------------------------------------------------------

async function appmaster(tab) {
  tab = tab || "logs";
  const tabs = ["logs", "metrics", "configuration", "thread-dump"].map((t) => `<a href="#/appmaster/${t}"
      class="${t === tab ? "active" : ""}" id="am-tab-${t}">${{logs: "Logs", metrics: "Metrics",
      configuration: "Configuration", "thread-dump": "Thread dump"}[t]}</a>`);
  let content;
  if (tab === "metrics") {
    const names = (await api("/jobmanager/metrics")).map((m) => m.id);
    const values = names.length ? await api(`/jobmanager/metrics?get=${names.map(encodeURIComponent).join(",")}`) : [];
    content = `<table id="am-metrics"><thead><tr><th>Metric</th><th>Value</th></tr></thead><tbody>${values.map((m) =>
      `<tr><td>${esc(m.id)}</td><td>${esc(m.value)}</td></tr>`).join("")}</tbody></table>`;
  } else if (tab === "configuration") {
    const config = await api("/jobmanager/config");
    content = `<table id="am-config"><thead><tr><th>Key</th><th>Value</th></tr></thead><tbody>${config.map((e) =>
      `<tr><td>${esc(e.key)}</td><td>${esc(e.value)}</td></tr>`).join("")}</tbody></table>`;
  } else if (tab === "thread-dump") {
    const d = await api("/jobmanager/thread-dump");
    content = `<table id="am-threads"><thead><tr><th>Thread</th><th>Stack</th></tr></thead><tbody>${d.threadInfos.map((t) =>
      `<tr><td>${esc(t.threadName)}</td><td>${trace(t.stringifiedThreadInfo)}</td></tr>`).join("")}</tbody></table>`;
  } else {
    const logs = await api("/jobmanager/logs");
    const files = logs.logs.map((f) => `<li><a href="#/logs/appmaster/${encodeURIComponent(f.name)}">${esc(f.name)}</a>
        <span class="muted">${fmtBytes(f.size)}</span></li>`);
    content = `<ul id="am-logs">${files.join("")}<li><a href="#/logs/appmaster/jobmanager.out">standard output</a></li></ul>`;
  }
  return `<h2>AppMaster</h2><div class="tabs">${tabs.join("")}</div><div id="tab-content">${content}</div>`;
}

// A log in a viewer: its last lines (the whole file on request), filtered as you type, warnings
// and errors marked; the raw file a link away. The AppMaster's and a TaskExecutor's alike.
const LOG_TAIL = 2000;
const LOG_TAIL_BYTES = 2 << 20;  // (a refresh fetches only the file's end: an HTTP range)
const logState = {};  // per log: show all of it?

async function logViewer(kind, a, b) {
  const tm = kind === "taskmanager" ? decodeURIComponent(a) : "";
  const name = decodeURIComponent(kind === "taskmanager" ? b : a);
  const raw = kind === "taskmanager" ? `/taskmanagers/${encodeURIComponent(tm)}/logs/${encodeURIComponent(name)}`
    : `/jobmanager/logs/${encodeURIComponent(name)}`;
  const key = `${kind}/${tm}/${name}`;
  const listed = await api(kind === "taskmanager" ? `/taskmanagers/${encodeURIComponent(tm)}/logs` : "/jobmanager/logs");
  const size = (listed.logs.find((f) => f.name === name) || {}).size || 0;
  const tail = !logState[key] && size > LOG_TAIL_BYTES;
  const response = await fetch(rel(raw), tail ? {headers: {Range: `bytes=${size - LOG_TAIL_BYTES}-`}} : {});
  if (response.status === 401) { location.href = `login${location.hash}`; throw new Error("401"); }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(`${response.status}: ${(body.errors || [response.statusText]).join("; ")}`);
  }
  let text = await response.text();
  const partial = response.status === 206;
  if (partial) text = text.slice(text.indexOf("\n") + 1);  // (the range began inside a line)
  const box = document.getElementById("log-filter");
  const typed = box && box.dataset.log === key ? box.value : "";
  const needle = typed.trim().toLowerCase();
  let lines = text.split("\n");
  const total = lines.length;
  if (needle) lines = lines.filter((l) => l.toLowerCase().includes(needle));
  const cut = !logState[key] && (partial || lines.length > LOG_TAIL);
  if (cut) lines = lines.slice(-LOG_TAIL);
  const level = (l) => / (ERROR|CRITICAL) /.test(l) ? "log-error" : / WARNING /.test(l) ? "log-warning" : "";
  const body = lines.map((l) => `<span class="${level(l)}">${esc(l)}</span>`).join("\n");
  const back = kind === "taskmanager" ? `<a href="#/taskmanagers/${encodeURIComponent(tm)}">TaskExecutor ${esc(tm)}</a>`
    : `<a href="#/appmaster/logs">AppMaster</a>`;
  return `<h2>${esc(name)}</h2><p class="muted">${back} · ${partial ? "its end: " : ""}${total} lines${needle ? `, ${lines.length} matching` : ""}
      ${cut ? ` · the last ${LOG_TAIL} shown <button id="log-all" data-log="${esc(key)}">Show all</button>` : ""}
      · <a href="${rel(raw)}" target="_blank" rel="noopener">raw file</a></p>
    <div class="toolbar"><label for="log-filter">Filter lines</label><input id="log-filter" type="search"
      data-log="${esc(key)}" value="${esc(typed)}" placeholder="text to find (e.g. WARNING, a job id)"></div>
    <pre id="log-view" class="log" tabindex="0" aria-label="the log">${body}</pre>`;
}

// ---- submitting jobs (Flink's /jars) ---------------------------------------------------------------

let submitMessage = "";  // what the last upload, run or plan said (kept across refreshes)

async function submitPage() {
  const data = await api("/jars");
  const rows = data.files.map((f) => `<tr id="jar-${esc(f.id)}"><td>${esc(f.name)}</td><td>${fmtTime(f.uploaded)}</td>
      <td><select class="jar-entry" aria-label="entry of ${esc(f.name)}">${f.entry.map((e) => `<option>${esc(e.name)}</option>`).join("")}</select></td>
      <td><input class="jar-args" placeholder="arguments, space separated" size="30" aria-label="arguments of ${esc(f.name)}"></td>
      <td><input class="jar-parallelism" type="number" min="1" placeholder="default" style="width:6em"
        aria-label="parallelism of ${esc(f.name)}"></td>
      <td><input class="jar-savepoint" placeholder="savepoint path (optional)" size="22"
        aria-label="savepoint to start ${esc(f.name)} from"></td>
      <td><button class="jar-run" data-jar="${esc(f.id)}">Run</button> <button class="jar-plan" data-jar="${esc(f.id)}">Plan</button>
        <button class="danger jar-delete" data-jar="${esc(f.id)}">Delete</button></td></tr>`);
  const table = rows.length ? `<table id="jars-table"><thead><tr><th>Job file</th><th>Uploaded</th><th>Entry</th><th>Arguments</th>
      <th>Parallelism</th><th>Savepoint</th><th></th></tr></thead><tbody>${rows.join("")}</tbody></table>`
    : `<p class="muted" id="no-jars">Nothing uploaded yet.</p>`;
  return `<h2>Submit a job</h2><p class="muted">A Python job file, or a zip of one with the modules it imports.</p>
    <div class="toolbar"><label for="jar-file">Job file</label><input type="file" id="jar-file" accept=".py,.zip">
    <button id="jar-upload">Upload</button></div>
    <div id="submit-result">${submitMessage}</div>${table}`;
}

function runRequest(row) {
  const body = {programArgsList: row.querySelector(".jar-args").value.split(/\s+/).filter(Boolean)};
  const p = row.querySelector(".jar-parallelism").value;
  if (p) body.parallelism = Number(p);
  const sp = row.querySelector(".jar-savepoint").value.trim();
  if (sp) body.savepointPath = sp;
  const entry = row.querySelector(".jar-entry").value;
  if (entry) body.entryClass = entry;
  return body;
}

async function onSubmitAction(button) {
  button.disabled = true;
  try {
    if (button.id === "jar-upload") {
      const file = document.getElementById("jar-file").files[0];
      if (!file) throw new Error("choose a job file first");
      const form = new FormData();
      form.append("jarfile", file);
      await api("/jars/upload", {method: "POST", body: form});
      submitMessage = `<p class="ok">Uploaded ${esc(file.name)}.</p>`;
    } else {
      const jar = button.dataset.jar;
      const row = button.closest("tr");
      if (button.classList.contains("jar-delete")) {
        await api(`/jars/${encodeURIComponent(jar)}`, {method: "DELETE"});
        submitMessage = "";
      } else {
        const kind = button.classList.contains("jar-run") ? "run" : "plan";
        const answer = await api(`/jars/${encodeURIComponent(jar)}/${kind}`, {method: "POST",
          headers: {"Content-Type": "application/json"}, body: JSON.stringify(runRequest(row))});
        submitMessage = kind === "run"
          ? `<p class="ok" id="submitted">Submitted job <a href="#/jobs/${esc(answer.jobid)}">${esc(answer.jobid)}</a>.</p>`
          : `<h3>Plan</h3><ul id="jar-plan">${answer.plan.nodes.map((n) => `<li>${esc(n.description)}
              (parallelism ${n.parallelism})</li>`).join("")}</ul>`;
      }
    }
  } catch (e) {  // said on the page, in place of what the last action said (never left to look current)
    const what = button.id === "jar-upload" ? "Upload" : button.classList.contains("jar-run") ? "Run"
      : button.classList.contains("jar-plan") ? "Plan" : "Delete";
    submitMessage = `<p class="error" id="submit-error" role="alert">${what} failed: ${esc(e.message)}</p>`;
  }
  button.disabled = false;
  render();
}

// ---- routing ------------------------------------------------------------------------------------

let shown = "";  // the route the view shows: a new one starts from the top

async function render() {
  clearTimeout(timer);
  const route = location.hash.replace(/^#\/?/, "") || "overview";
  const parts = route.split("/");
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === parts[0]));
  const view = document.getElementById("view");
  try {
    const html = parts[0] === "jobs" && parts[1] ? await job(parts[1], parts[2], parts[3], parts[4])
      : parts[0] === "jobs" ? await jobs()
      : parts[0] === "taskmanagers" && parts[2] === "thread-dump" ? await threadDump(parts[1])
      : parts[0] === "taskmanagers" ? await taskmanagers(parts[1])
      : parts[0] === "submit" ? await submitPage()
      : parts[0] === "appmaster" ? await appmaster(parts[1])
      : parts[0] === "logs" ? await logViewer(parts[1], parts[2], parts[3])
      : await overview();
    if (route !== shown) { view.innerHTML = ""; window.scrollTo(0, 0); }
    morph(view, html);
    shown = route;
    showError("");
  } catch (e) {
    if (route !== shown) { view.innerHTML = ""; shown = route; }  // not the previous page under the error
    showError(e.message);
  }
  timer = setTimeout(render, REFRESH_MS);
}

async function start() {
  if (!location.pathname.endsWith("/")) {  // (relative URLs need the page's folder: "/proxy/app" is "/proxy/app/")
    location.replace(`${location.pathname}/${location.search}${location.hash}`);
    return;
  }
  try {
    const config = await api("/config");
    document.getElementById("cluster").textContent = `cluster ${config["cluster-id"]} · yarnflow ${config["flink-version"]}`;
    features = config.features || {};
    document.querySelector('nav a[data-nav="submit"]').hidden = !features["web-submit"];
  } catch (e) { showError(e.message); }
  window.addEventListener("hashchange", render);
  document.addEventListener("click", onClick);
  document.addEventListener("input", (event) => {
    if (event.target.id === "job-search" || event.target.id === "log-filter") render();
  });
  render();
}

start();
