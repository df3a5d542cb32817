// The sandbox page: every value from the server is shown as text (textContent), never as HTML.
"use strict";

const token = new URLSearchParams(location.hash.slice(1)).get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};
let chosen = null;
let logCount = 0;

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

async function api(path, body) {
  const options = body === undefined
    ? { headers }
    : { method: "POST", headers: { ...headers, "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const response = await fetch(path, options);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail);
    throw new Error(detail || response.statusText);
  }
  return data;
}

function showError(err) {
  document.getElementById("error").textContent = err ? String(err.message || err) : "";
}

function fill(list, items, render) {
  const node = document.getElementById(list);
  node.replaceChildren(...items.map(render));
}

async function loadAgents() {
  const q = encodeURIComponent(document.getElementById("search").value);
  const feature = encodeURIComponent(document.getElementById("feature").value);
  const agents = await api(`/api/agents?q=${q}&feature=${feature}`);
  fill("agents", agents, (a) => {
    const li = el("li", `${a.name} (${a.features.join(", ") || "no features"}; ${a.interests.join(", ")})`);
    li.dataset.name = a.name;
    if (a.name === chosen) li.classList.add("chosen");
    li.addEventListener("click", () => { chosen = a.name; loadAgent(); loadAgents(); });
    return li;
  });
  if (!chosen && agents.length) { chosen = agents[0].name; loadAgent(); }
}

async function loadAgent() {
  if (!chosen) return;
  const a = await api(`/api/agents/${encodeURIComponent(chosen)}`);
  document.getElementById("agent-name").textContent = a.profile.name;
  const profile = document.getElementById("profile");
  const rows = [];
  for (const key of ["id", "user", "gender", "age", "career", "traits", "interests", "dislikes", "mean_stars", "features", "source"]) {
    const value = Array.isArray(a.profile[key]) ? a.profile[key].join("; ") : a.profile[key];
    rows.push(el("dt", key), el("dd", value === null || value === undefined || value === "" ? "—" : value, { "data-field": key }));
  }
  const sources = Object.entries(a.profile.feature_sources || {}).map(([f, s]) => `${f}: ${s}`).join("; ");
  rows.push(el("dt", "features from"), el("dd", sources || "—"));
  const real = a.real_history;
  rows.push(el("dt", "real history"), el("dd", real.ratings ? `${real.ratings} ratings before ${real.before}` : "none", { id: "real-count" }));
  rows.push(el("dt", "watched here"), el("dd", a.simulated_watches.length));
  rows.push(el("dt", "memory"), el("dd", `started with ${a.memory.started_with} of its ratings; ${a.memory.long_term_records} long-term records now`));
  profile.replaceChildren(...rows);
  fill("real", real.last, (r) => el("li", `${r.date}: ${r.title} — ${r.stars} of 5`));
  const memory = (r) => el("li", `${r.text} (${r.kind}, importance ${r.importance.toFixed(2)}, round ${r.created})`);
  fill("short", a.memory.short_term, memory);
  fill("long", a.memory.long_term, memory);
  fill("insights", a.memory.insights, memory);
  fill("history", a.history.slice(-20).reverse(), (e) => el("li", describe(e)));
}

function describe(e) {
  const item = e.item !== null && e.item !== undefined ? ` ${e.title || "item " + e.item}` : "";
  const text = e.text ? `: ${e.text}` : "";
  return `round ${e.round} · ${e.agent} · ${e.action}${item}${text}`.slice(0, 400);
}

function lineChart(title, points) {
  const box = el("div", null, { class: "chart" });
  box.append(el("h4", title));
  const chart = svg("svg", { viewBox: "0 0 220 110", role: "img", "aria-label": title });
  const values = points.map((p) => p[1]).filter((v) => v !== null);
  if (values.length) {
    const top = Math.max(...values, 1e-9), rounds = points.map((p) => p[0]);
    const left = Math.min(...rounds), right = Math.max(...rounds, left + 1);
    const xy = points.filter((p) => p[1] !== null)
      .map((p) => [10 + (200 * (p[0] - left)) / (right - left), 100 - (88 * p[1]) / top]);
    chart.append(svg("polyline", { points: xy.map((p) => p.join(",")).join(" "), fill: "none", stroke: "#1b5fa8", "stroke-width": 2 }));
    for (const [x, y] of xy) chart.append(svg("circle", { cx: x, cy: y, r: 2.5, fill: "#1b5fa8" }));
    const label = svg("text", { x: 12, y: 12, "font-size": 10 });
    label.textContent = `max ${Number(top.toFixed(3))}, last ${values[values.length - 1]}`;
    chart.append(label);
  }
  box.append(chart);
  return box;
}

async function loadStats() {
  const rows = await api("/api/stats");
  const charts = [
    ["active agents", "active_agents"], ["watches", "watches"], ["chats", "chats"],
    ["posts", "posts"], ["exposure genre entropy (bits)", "exposure_genre_entropy"],
  ];
  document.getElementById("charts").replaceChildren(
    ...charts.map(([title, key]) => lineChart(title, rows.map((r) => [r.round, r[key]]))));
}

async function loadGraph() {
  const g = await api("/api/graph");
  const node = document.getElementById("graph");
  const where = {};
  g.nodes.forEach((name, i) => {
    const angle = (2 * Math.PI * i) / g.nodes.length;
    where[name] = [200 + 160 * Math.cos(angle), 200 + 160 * Math.sin(angle)];
  });
  const parts = g.edges.map(([a, b]) => svg("line", { x1: where[a][0], y1: where[a][1], x2: where[b][0], y2: where[b][1] }));
  for (const name of g.nodes) {
    parts.push(svg("circle", { cx: where[name][0], cy: where[name][1], r: 5 }));
    const label = svg("text", { x: where[name][0] + 7, y: where[name][1] + 3 });
    label.textContent = name;
    parts.push(label);
  }
  node.replaceChildren(...parts);
}

function appendLog(e) {
  const log = document.getElementById("log");
  log.append(el("li", describe(e)));
  while (log.children.length > 300) log.firstChild.remove();
  log.scrollTop = log.scrollHeight;
  logCount += 1;
}

let lastRound = -1;
function showStatus(s) {
  document.getElementById("run").textContent = s.run + (s.read_only ? " (read-only)" : "");
  const state = s.read_only ? "read-only" : s.busy ? "playing a round" : s.playing ? "running" : "paused";
  document.getElementById("status").textContent =
    `round ${s.round} of ${s.rounds} · ${state}` + (s.human ? ` · you play ${s.human}` : "");
  for (const id of ["start", "pause", "resume", "step", "takeover"]) document.getElementById(id).disabled = s.read_only;
  for (const button of document.querySelectorAll("#edit button, #interview button, #broadcast button")) {
    button.disabled = s.read_only;
  }
  if (s.error) showError(s.error);
  const view = document.getElementById("human-view");
  view.hidden = !s.pending;
  if (s.pending) {
    document.getElementById("human-name").textContent = s.pending.agent;
    document.getElementById("human-prompt").textContent = s.pending.prompt;
    const options = document.getElementById("human-options");
    options.replaceChildren(...(s.pending.options || []).map((o) => {
      const b = el("button", o);
      b.addEventListener("click", () => api("/api/human/answer", { answer: o }).catch(showError));
      return b;
    }));
    document.getElementById("human-json").hidden = !s.pending.keys;
    document.getElementById("human-answer").placeholder = s.pending.keys ? `JSON with ${s.pending.keys.join(", ")}` : "";
  }
  if (s.round !== lastRound) {
    lastRound = s.round;
    loadStats().catch(showError);
    loadAgent().catch(showError);
  }
}

async function follow() {
  // server-sent events read through fetch, so the token travels in a header, not in the URL
  try {
    const response = await fetch(`/api/events?after=${logCount}`, { headers });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const chunk = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const kind = /^event: (.*)$/m.exec(chunk)?.[1];
        const data = /^data: (.*)$/m.exec(chunk)?.[1];
        if (!data) continue;
        if (kind === "interaction") appendLog(JSON.parse(data));
        else if (kind === "status") showStatus(JSON.parse(data));
      }
    }
  } catch (err) { showError(err); }
  setTimeout(follow, 2000);  // reconnect
}

function control(action) {
  return () => api("/api/control", { action }).then(showStatus).then(() => showError(null)).catch(showError);
}

function onSubmit(id, handler) {
  document.getElementById(id).addEventListener("submit", (event) => {
    event.preventDefault();
    handler().then(() => showError(null)).catch(showError);
  });
}

document.getElementById("start").addEventListener("click", control("start"));
document.getElementById("pause").addEventListener("click", control("pause"));
document.getElementById("resume").addEventListener("click", control("resume"));
document.getElementById("step").addEventListener("click", control("step"));
document.getElementById("search").addEventListener("input", () => loadAgents().catch(showError));
document.getElementById("feature").addEventListener("change", () => loadAgents().catch(showError));
document.getElementById("takeover").addEventListener("click", () =>
  api("/api/human", { agent: chosen }).catch(showError));
onSubmit("edit", async () => {
  const field = document.getElementById("edit-field").value;
  const value = document.getElementById("edit-value").value;
  await api(`/api/agents/${encodeURIComponent(chosen)}/profile`, { field, value });
  document.getElementById("edit-value").value = "";
  await loadAgent();
  await loadAgents();
});
onSubmit("interview", async () => {
  const question = document.getElementById("question").value;
  document.getElementById("answer").textContent = "asking…";
  const record = await api("/api/interview", { agent: chosen, question });
  document.getElementById("answer").textContent = `${record.agent}: ${record.answer}`;
});
onSubmit("broadcast", async () => {
  await api("/api/broadcast", { message: document.getElementById("message").value });
  document.getElementById("message").value = "";
});
onSubmit("human-json", async () => {
  await api("/api/human/answer", { answer: document.getElementById("human-answer").value });
  document.getElementById("human-answer").value = "";
});

loadAgents().catch(showError);
loadGraph().catch(showError);
loadStats().catch(showError);
follow();
