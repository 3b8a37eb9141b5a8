// The gpufleet dashboard: one page, plain ES module, no dependencies. Everything it shows comes
// from the same /api/v1 the CLI uses, with the token the person logged in with; the server decides
// what that token may see and do. The token lives in sessionStorage only (gone with the tab), and
// the page builds its DOM with textContent, never HTML from data.

const TOKEN_KEY = "gpufleet.token";
const REFRESH_MS = 2000;
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const main = document.getElementById("main");
const statusLine = document.getElementById("status");

let me = null;           // whoami: {id, user, team, role, scope}
let refreshTimer = null; // the current view's poll
let renderSerial = 0;    // a view answers only while it is still the one shown

// ---- DOM and API helpers -------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "class") element.className = value;
    else element.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path, options = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = { Authorization: `Bearer ${token}` };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(`/api/v1${path}`, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    cache: "no-store",
  });
  if (response.status === 401) {
    logOut("the token was refused (revoked or expired?): log in again");
    throw new ApiError(401, "unauthorized");
  }
  if (options.text) {
    if (!response.ok) throw new ApiError(response.status, await errorText(response));
    return { text: await response.text(), headers: response.headers };
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(response.status, body.error || `HTTP ${response.status}`);
  return body;
}

async function errorText(response) {
  const body = await response.text();
  try {
    return JSON.parse(body).error || body;
  } catch {
    return body;
  }
}

function say(message, isError = false) {
  statusLine.textContent = message;
  statusLine.className = isError ? "error" : "";
}

function stateBadge(state) {
  return h("span", { class: `state ${state}` }, state);
}

function gpus(milli) {
  const value = milli / 1000;
  return Number.isInteger(value) ? String(value) : value.toFixed(2);
}

function age(ms) {
  if (!ms) return "";
  const seconds = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (seconds < 120) return `${seconds}s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)}m`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)}h`;
  return `${Math.round(seconds / 86400)}d`;
}

function duration(fromMs, toMs) {
  if (!fromMs) return "";
  const seconds = Math.round(((toMs || Date.now()) - fromMs) / 1000);
  if (seconds < 120) return `${seconds}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m${seconds % 60}s`;
  return `${Math.floor(seconds / 3600)}h${Math.floor((seconds % 3600) / 60)}m`;
}

function table(columns, rows, onRow) {
  return h("table", {},
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : null }, c.title)))),
    h("tbody", {}, rows.length === 0
      ? h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, "none"))
      : rows.map((row) => h("tr", {
          class: onRow ? "link" : null,
          onclick: onRow ? () => onRow(row) : null,
        }, columns.map((c) => h("td", { class: c.num ? "num" : null }, c.value(row)))))));
}

function isAdmin() {
  return me && me.role === "admin";
}

function canWrite() {
  return me && me.scope !== "read";
}

// ---- Log in ----------------------------------------------------------------------------------

function showLogin(reason) {
  stopRefresh();
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  const input = h("input", { type: "password", id: "token", autocomplete: "off",
                             placeholder: "gpf_…", "aria-label": "token" });
  const error = h("p", { class: "error", id: "login-error" }, reason || "");
  const form = h("form", { class: "login panel", id: "login" },
    h("h1", {}, "Log in"),
    h("p", { class: "muted" },
      "With a gpufleet token (gpufleet dev prints the admin token; `gpufleet token create` makes "
      + "others). It stays in this tab's session storage only."),
    input, h("button", { type: "submit" }, "Log in"), error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    try {
      await start();
    } catch (failure) {
      sessionStorage.removeItem(TOKEN_KEY);
      error.textContent = failure.status === 401 ? "that token is not valid"
                                                 : `cannot log in: ${failure.message}`;
    }
  });
  main.replaceChildren(h("section", { class: "panel login" }, form));
  input.focus();
}

function logOut(reason) {
  sessionStorage.removeItem(TOKEN_KEY);
  me = null;
  showLogin(reason);
}

async function start() {
  const response = await fetch("/api/v1/whoami", {
    headers: { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY)}` },
  });
  if (!response.ok) throw new ApiError(response.status, await errorText(response));
  me = await response.json();
  if (me.role !== "admin" && me.role !== "user")
    throw new ApiError(403, `a ${me.role} token cannot use the dashboard`);
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  document.getElementById("who").textContent =
    `${me.user} · ${me.team || "no team"} · ${me.role}${me.scope ? ` (${me.scope})` : ""}`;
  route();
}

// ---- Routing -------------------------------------------------------------------------------

function stopRefresh() {
  if (refreshTimer) clearTimeout(refreshTimer);
  refreshTimer = null;
}

// Renders a view now and every REFRESH_MS while it is shown; `draw` gets a serial to check.
function show(view, draw) {
  stopRefresh();
  const serial = ++renderSerial;
  for (const link of document.querySelectorAll("#nav a"))
    link.classList.toggle("active", link.dataset.view === view);
  const tick = async () => {
    try {
      await draw(serial);
      if (serial === renderSerial) say(`updated ${new Date().toLocaleTimeString()}`);
    } catch (failure) {
      if (failure.status !== 401 && serial === renderSerial) say(failure.message, true);
    }
    if (serial === renderSerial && me) refreshTimer = setTimeout(tick, REFRESH_MS);
  };
  tick();
}

function route() {
  if (!me) return;
  const [, view = "overview", id] = location.hash.split("?")[0].split("/");
  switch (view) {
    case "jobs": return id ? show("jobs", (serial) => jobDetail(serial, id)) : jobsView();
    case "nodes": return show("nodes", (serial) => nodesView(serial, id && decodeURIComponent(id)));
    case "queues": return show("queues", queuesView);
    case "usage": return usageView();
    case "deployments": return show("deployments", deploymentsView);
    default: return show("overview", overviewView);
  }
}

// Replaces the main area unless the person navigated away meanwhile (a slow answer for the view
// they left must not draw over the one they are on).
function render(serial, ...children) {
  if (serial !== renderSerial) return false;
  main.replaceChildren(...children);
  return true;
}

// ---- Overview --------------------------------------------------------------------------------

// The API's records, flattened for display: a node's report beside its state, a job's spec beside
// its status (spec.tasks is a count, record.tasks the tasks themselves).
function flatNode(record) {
  return { ...record.report, state: record.state, drained: record.drained,
           last_seen_ms: record.last_seen_ms, gpu_jobs: record.gpu_jobs || {} };
}

function flatJob(record) {
  const spec = record.spec || {};
  return { ...record, name: spec.name, queue: spec.queue, gpus: spec.gpus, nodes: spec.tasks,
           command: spec.command, image: spec.image };
}

async function fetchNodes() {
  return (await api("/nodes")).nodes.map(flatNode);
}

// The jobs holding a GPU now, by the node's own account: [job ids] or undefined.
function jobsOnGpu(node, gpu) {
  const ids = node.gpu_jobs[String(gpu.index)];
  return ids && ids.length ? ids : undefined;
}

function utilColour(pct) {
  // white (idle) to a deep blue (busy)
  const t = Math.max(0, Math.min(100, pct)) / 100;
  const r = Math.round(238 - t * (238 - 47));
  const g = Math.round(242 - t * (242 - 111));
  const b = Math.round(248 - t * (248 - 222));
  return `rgb(${r}, ${g}, ${b})`;
}

async function overviewView(serial) {
  const [nodes, queues] = await Promise.all([fetchNodes(), api("/queues")]);
  let total = 0, unhealthy = 0, busy = 0, idle = 0, readyNodes = 0;
  for (const node of nodes) {
    if (node.state === "ready") readyNodes++;
    for (const gpu of node.gpus) {
      total++;
      if (!gpu.healthy) unhealthy++;
      else if (jobsOnGpu(node, gpu)) busy++;
      else if (node.state === "ready" && !node.drained) idle++;
    }
  }
  const pending = queues.queues.reduce((sum, q) => sum + q.pending, 0);
  const running = queues.queues.reduce((sum, q) => sum + q.running, 0);
  const card = (label, value, id) =>
    h("div", { class: "card", id }, h("div", { class: "value" }, value), h("div", { class: "label" }, label));
  const heat = h("div", { class: "heatmap", id: "heatmap" }, nodes.map((node) =>
    h("div", { class: "row" },
      h("a", { class: "node", href: `#/nodes/${encodeURIComponent(node.name)}` },
        `${node.name}${node.drained ? " (drained)" : ""}`),
      node.gpus.map((gpu) => {
        const job = jobsOnGpu(node, gpu);
        const cell = h("div", {
          class: `gpu${job ? " allocated" : ""}${gpu.healthy ? "" : " unhealthy"}`,
          title: `GPU ${gpu.index} ${gpu.model}: ${gpu.utilization_pct.toFixed(0)}% util, `
            + `${gpu.memory_used_mib}/${gpu.memory_mib} MiB, ${gpu.temperature_c.toFixed(0)} °C, `
            + `${gpu.power_w.toFixed(0)} W`
            + (job ? `; job ${job.join(", ")}` : "; idle")
            + (gpu.healthy ? "" : `; UNHEALTHY: ${gpu.health_reason}`),
        }, `${gpu.utilization_pct.toFixed(0)}%`);
        if (gpu.healthy) cell.style.background = utilColour(gpu.utilization_pct);
        return cell;
      }))));
  render(serial,
    h("h1", {}, "Cluster"),
    h("div", { class: "cards" },
      card("GPUs", total, "gpus-total"),
      card("allocated", busy, "gpus-allocated"),
      card("idle", idle, "gpus-idle"),
      card("unhealthy", unhealthy, "gpus-unhealthy"),
      card("nodes ready", `${readyNodes}/${nodes.length}`, "nodes-ready"),
      card("jobs pending", pending, "jobs-pending"),
      card("jobs running", running, "jobs-running")),
    h("section", { class: "panel" },
      h("h2", {}, "GPU utilisation by node"),
      heat,
      h("p", { class: "legend" },
        "Colour: utilisation now. Outlined: allocated to a job. Striped: unhealthy.")),
    h("section", { class: "panel" }, h("h2", {}, "Queues"), queueTable(queues.queues)));
}

// ---- Jobs ------------------------------------------------------------------------------------

function jobsView() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const state = h("select", { name: "state", id: "filter-state" },
    ["", "pending", "scheduled", "starting", "running", "succeeded", "failed", "cancelled"].map(
      (s) => h("option", { value: s, selected: params.get("state") === s }, s || "any state")));
  const team = h("input", { name: "team", id: "filter-team", placeholder: "team",
                            value: params.get("team") || "" });
  const user = h("input", { name: "user", id: "filter-user", placeholder: "user",
                            value: params.get("user") || "" });
  const filters = h("form", { class: "inline", id: "job-filters" },
    h("label", {}, "state", state), h("label", {}, "team", team), h("label", {}, "user", user),
    h("button", { type: "submit", class: "secondary" }, "Filter"));
  filters.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [key, field] of [["state", state], ["team", team], ["user", user]])
      if (field.value.trim()) query.set(key, field.value.trim());
    location.hash = `#/jobs?${query}`;
  });
  const submitForm = canWrite() ? submitJobForm() : null;
  const listing = h("div", { id: "job-list" });
  main.replaceChildren(h("h1", {}, "Jobs"), submitForm || "", filters, listing);
  show("jobs", async (serial) => {
    const query = new URLSearchParams({ limit: "500" });
    for (const key of ["state", "team", "user"]) if (params.get(key)) query.set(key, params.get(key));
    const jobs = (await api(`/jobs?${query}`)).jobs.map(flatJob);
    if (serial !== renderSerial) return;
    listing.replaceChildren(table([
      { title: "id", value: (j) => j.id },
      { title: "name", value: (j) => j.name },
      { title: "user", value: (j) => j.user },
      { title: "team", value: (j) => j.team },
      { title: "queue", value: (j) => j.queue },
      { title: "state", value: (j) => stateBadge(j.state) },
      { title: "GPUs", num: true, value: (j) => `${(j.nodes || 1) > 1 ? `${j.nodes}×` : ""}${j.gpus}` },
      { title: "age", num: true, value: (j) => age(j.created_ms) },
      { title: "reason", value: (j) => h("span", { class: "muted" }, j.reason || "") },
    ], jobs, (j) => { location.hash = `#/jobs/${j.id}`; }));
  });
}

function submitJobForm() {
  const field = (name, attrs = {}) => h("input", { name, id: `submit-${name}`, ...attrs });
  const name = field("name", { placeholder: "name (optional)" });
  const gpusField = field("gpus", { type: "number", min: "0", step: "0.25", value: "1" });
  const queue = field("queue", { value: "default" });
  const image = field("image", { placeholder: "image (optional)" });
  const command = field("command", { class: "wide", required: true,
                                     placeholder: "shell command, e.g. python train.py" });
  const error = h("span", { class: "error", id: "submit-error" });
  const form = h("form", { class: "inline panel", id: "submit-job" },
    h("label", {}, "command", command), h("label", {}, "GPUs", gpusField),
    h("label", {}, "queue", queue), h("label", {}, "name", name), h("label", {}, "image", image),
    h("button", { type: "submit" }, "Submit"), error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    const body = { command: ["sh", "-c", command.value], gpus: Number(gpusField.value),
                   queue: queue.value.trim() || "default" };
    if (name.value.trim()) body.name = name.value.trim();
    if (image.value.trim()) body.image = image.value.trim();
    try {
      const job = await api("/jobs", { method: "POST", body });
      location.hash = `#/jobs/${job.id}`;
    } catch (failure) {
      error.textContent = failure.message;
    }
  });
  return form;
}

// A job's page keeps its log pane across refreshes and appends only the new bytes.
let logPane = null; // {jobId, task, stream, offset, element, finished}

async function pumpLogs(job) {
  if (!logPane || logPane.jobId !== job.id || logPane.finished) return;
  if (!(job.tasks || []).some((t) => t.rank === logPane.task && t.workload_id)) return;
  const query = new URLSearchParams({ task: logPane.task, stream: logPane.stream,
                                      offset: logPane.offset });
  try {
    const { text, headers } = await api(`/jobs/${job.id}/logs?${query}`, { text: true });
    logPane.element.append(text);
    logPane.offset = Number(headers.get("X-Log-Next-Offset"));
    if (headers.get("X-Log-Finished") === "true") logPane.finished = true;
  } catch (failure) {
    if (failure.status === 401) throw failure;
    logPane.note.textContent = `logs: ${failure.message}`;
  }
}

async function jobDetail(serial, id) {
  const job = flatJob(await api(`/jobs/${encodeURIComponent(id)}`));
  if (serial !== renderSerial) return;
  if (!logPane || logPane.jobId !== job.id) {
    logPane = { jobId: job.id, task: 0, stream: "stdout", offset: 0, finished: false,
                element: h("pre", { class: "logs", id: "logs" }), note: h("span", { class: "muted" }) };
  }
  await pumpLogs(job);
  if (serial !== renderSerial) return;
  const cancel = canWrite() && !TERMINAL.has(job.state)
    ? h("button", { class: "danger", id: "cancel-job", onclick: async (event) => {
        event.target.disabled = true;
        try {
          await api(`/jobs/${job.id}/cancel`, { method: "POST" });
          say(`cancelling job ${job.id}`);
        } catch (failure) {
          say(failure.message, true);
          event.target.disabled = false;
        }
      } }, "Cancel")
    : null;
  const taskPicker = h("select", { id: "log-task", onchange: (event) => {
    logPane = { ...logPane, task: Number(event.target.value), offset: 0, finished: false,
                element: h("pre", { class: "logs", id: "logs" }) };
    route();
  } }, (job.tasks || []).map((t) => h("option", { value: t.rank, selected: t.rank === logPane.task },
                                      `task ${t.rank}`)));
  const streamPicker = h("select", { id: "log-stream", onchange: (event) => {
    logPane = { ...logPane, stream: event.target.value, offset: 0, finished: false,
                element: h("pre", { class: "logs", id: "logs" }) };
    route();
  } }, ["stdout", "stderr"].map((s) => h("option", { value: s, selected: s === logPane.stream }, s)));
  render(serial,
    h("h1", {}, `Job ${job.id}: ${job.name} `, stateBadge(job.state), " ", cancel),
    h("section", { class: "panel" }, h("dl", { class: "fields", id: "job-fields" },
      [["user", `${job.user} (${job.team || "no team"})`], ["queue", job.queue],
       ["GPUs", `${(job.nodes || 1) > 1 ? `${job.nodes} tasks × ` : ""}${job.gpus}`],
       ["command", (job.command || []).join(" ")], ["image", job.image || "none (a process)"],
       ["reason", h("span", { id: "job-reason" }, job.reason || "—")],
       ["created", new Date(job.created_ms).toLocaleString()],
       ["ran for", job.started_ms ? duration(job.started_ms, job.finished_ms) : "—"]]
        .flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]))),
    h("h2", {}, "Tasks"),
    table([
      { title: "rank", value: (t) => t.rank },
      { title: "node", value: (t) => t.node },
      { title: "GPUs", value: (t) => (t.gpu_indices || []).join(", ") },
      { title: "state", value: (t) => t.state || "" },
      { title: "exit", value: (t) => (t.exit_code ?? "") },
      { title: "error", value: (t) => t.error || "" },
    ], job.tasks || []),
    h("h2", {}, "Events"),
    table([
      { title: "time", value: (e) => new Date(e.time_ms).toLocaleTimeString() },
      { title: "from", value: (e) => e.from },
      { title: "to", value: (e) => e.to },
      { title: "reason", value: (e) => e.reason },
    ], job.events || []),
    h("h2", {}, "Logs ", taskPicker, " ", streamPicker, " ", logPane.note),
    logPane.element);
}

// ---- Nodes -----------------------------------------------------------------------------------

async function nodesView(serial, name) {
  const nodes = await fetchNodes();
  const action = (node) => {
    if (!isAdmin() || !canWrite()) return "";
    const verb = node.drained ? "undrain" : "drain";
    return h("button", { class: "secondary", "data-node": node.name, id: `${verb}-${node.name}`,
                         onclick: async (event) => {
      event.stopPropagation();
      event.target.disabled = true;
      try {
        await api(`/nodes/${encodeURIComponent(node.name)}/${verb}`, { method: "POST", body: {} });
        say(`${verb}ed ${node.name}`);
        route();
      } catch (failure) {
        say(failure.message, true);
        event.target.disabled = false;
      }
    } }, verb === "drain" ? "Drain" : "Undrain");
  };
  const listing = table([
    { title: "node", value: (n) => n.name },
    { title: "state", value: (n) => h("span", {}, stateBadge(n.state), n.drained ? " " : "",
                                      n.drained ? stateBadge("drained") : "") },
    { title: "backend", value: (n) => n.backend },
    { title: "GPUs", value: (n) => `${n.gpus.length} × ${n.gpus[0]?.model || "—"}` },
    { title: "healthy", num: true, value: (n) => n.gpus.filter((g) => g.healthy).length },
    { title: "allocated", num: true, value: (n) => n.gpus.filter((g) => jobsOnGpu(n, g)).length },
    { title: "rack", value: (n) => n.rack || "" },
    { title: "last seen", num: true, value: (n) => age(n.last_seen_ms) },
    { title: "", value: action },
  ], nodes, (n) => { location.hash = `#/nodes/${encodeURIComponent(n.name)}`; });
  const node = name && nodes.find((n) => n.name === name);
  const detail = node ? h("section", { class: "panel", id: "node-detail" },
    h("h2", {}, `${node.name}: GPUs`),
    table([
      { title: "GPU", value: (g) => g.index },
      { title: "model", value: (g) => g.model },
      { title: "health", value: (g) => g.healthy ? stateBadge("ready")
                                                 : h("span", {}, stateBadge("unhealthy"), ` ${g.health_reason}`) },
      { title: "util", num: true, value: (g) => `${g.utilization_pct.toFixed(0)}%` },
      { title: "memory", num: true, value: (g) => `${g.memory_used_mib} / ${g.memory_mib} MiB` },
      { title: "temp", num: true, value: (g) => `${g.temperature_c.toFixed(0)} °C` },
      { title: "power", num: true, value: (g) => `${g.power_w.toFixed(0)} W` },
      { title: "jobs", value: (g) => (jobsOnGpu(node, g) || []).join(", ") },
      { title: "uuid", value: (g) => h("code", {}, g.uuid) },
    ], node.gpus)) : null;
  render(serial, h("h1", {}, "Nodes"), h("div", { id: "node-list" }, listing), detail || "");
}

// ---- Queues, usage, deployments ---------------------------------------------------------------

function queueTable(queues) {
  return table([
    { title: "queue", value: (q) => q.name },
    { title: "cohort", value: (q) => q.cohort || "" },
    { title: "guaranteed GPUs", num: true, value: (q) => q.configured ? gpus(q.gpu_milli_guaranteed) : "" },
    { title: "borrowing limit", num: true,
      value: (q) => q.gpu_milli_borrowing_limit === undefined || q.gpu_milli_borrowing_limit === null
        ? "" : gpus(q.gpu_milli_borrowing_limit) },
    { title: "GPUs running", num: true, value: (q) => gpus(q.gpu_milli_running) },
    { title: "borrowed", num: true,
      value: (q) => q.configured ? gpus(Math.max(0, q.gpu_milli_running - q.gpu_milli_guaranteed)) : "" },
    { title: "GPUs pending", num: true, value: (q) => gpus(q.gpu_milli_pending) },
    { title: "jobs running", num: true, value: (q) => q.running },
    { title: "jobs pending", num: true, value: (q) => q.pending },
    { title: "weight", num: true, value: (q) => q.weight },
    { title: "fair-share factor", num: true, value: (q) => Number(q.fair_share_factor).toFixed(3) },
    { title: "teams", value: (q) => (q.teams || []).join(", ") || "all" },
  ], queues);
}

async function queuesView(serial) {
  const { queues } = await api("/queues");
  render(serial, h("h1", {}, "Queues and quotas"), h("div", { id: "queue-list" }, queueTable(queues)));
}

function usageView() {
  const period = h("select", { id: "usage-period" },
    [["1h", 3600e3], ["24h", 86400e3], ["7d", 7 * 86400e3], ["30d", 30 * 86400e3], ["all time", 0]]
      .map(([label, ms]) => h("option", { value: ms, selected: label === "24h" }, label)));
  const by = h("select", { id: "usage-by" },
    ["team", "user"].map((b) => h("option", { value: b }, `by ${b}`)));
  const listing = h("div", { id: "usage-list" });
  const controls = h("form", { class: "inline" }, h("label", {}, "period", period),
                     h("label", {}, "grouped", by));
  main.replaceChildren(h("h1", {}, "GPU usage"), controls, listing);
  const draw = async (serial) => {
    const query = new URLSearchParams({ by: by.value });
    if (Number(period.value) > 0) query.set("since_ms", String(Date.now() - Number(period.value)));
    const { usage } = await api(`/usage?${query}`);
    if (serial !== renderSerial) return;
    listing.replaceChildren(table([
      { title: "team", value: (u) => u.team },
      ...(by.value === "user" ? [{ title: "user", value: (u) => u.user }] : []),
      { title: "GPU-hours", num: true, value: (u) => Number(u.gpu_hours).toFixed(3) },
      { title: "jobs", num: true, value: (u) => u.jobs },
    ], usage));
  };
  period.addEventListener("change", () => show("usage", draw));
  by.addEventListener("change", () => show("usage", draw));
  show("usage", draw);
}

async function deploymentsView(serial) {
  const { deployments } = await api("/deployments");
  render(serial, h("h1", {}, "Deployments"), h("div", { id: "deployment-list" }, table([
    { title: "name", value: (d) => d.name },
    { title: "team", value: (d) => d.team },
    { title: "models", value: (d) => (d.spec?.models || d.models || []).join(", ") },
    { title: "replicas ready/desired", num: true, value: (d) => `${d.ready_replicas}/${d.desired_replicas}` },
    { title: "why", value: (d) => h("span", { class: "muted" }, d.desired_reason || "") },
    { title: "replicas", value: (d) => (d.replicas || []).map((r) =>
        h("span", {}, stateBadge(r.state), ` ${r.node || ""} `)) },
  ], deployments)));
}

// ---- Start -----------------------------------------------------------------------------------

document.getElementById("logout").addEventListener("click", () => logOut("logged out"));
window.addEventListener("hashchange", route);
if (sessionStorage.getItem(TOKEN_KEY)) {
  start().catch((failure) => logOut(`log in again: ${failure.message}`));
} else {
  showLogin();
}
