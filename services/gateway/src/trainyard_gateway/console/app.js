// Trainyard's web console: plain modules, no build step, served by the gateway.
// Every value from the platform is put on the page as text (textContent), never as HTML.

const TOKEN_KEY = "trainyard.token";
const STATES = ["SUBMITTED", "ACCEPTED", "REJECTED", "QUEUED", "PLACED", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED", "PAUSED"];
const TERMINAL = new Set(["REJECTED", "SUCCEEDED", "FAILED", "STOPPED"]);
const DIALECTS = ["native", "openpai", "dlc", "t9k", "kubeflow", "ti"];
// The states each command has an effect in (docs/lifecycle.md; the API takes each in
// every state and does nothing with it elsewhere): a restart of a queued job leaves it
// as it is, a paused one is resumed as the next attempt.
const ACTIONS = {
  pause: new Set(["ACCEPTED", "QUEUED", "PLACED", "RUNNING"]),
  resume: new Set(["PAUSED"]),
  restart: new Set(["PLACED", "RUNNING", "PAUSED"]),
};
const PAGE = 20;

const view = document.getElementById("view");
const announcer = document.getElementById("announce");
let me = null; // {user, admin}
let leave = []; // what the current page must stop when another opens (streams)

// --- helpers ---------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

// The most of a log kept on the page, and the terminal escapes (colours, cursor moves)
// taken out of what is shown.
const LOG_CHARS = 2_000_000;
const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;

// What a terminal shows of a task's output, read by read: escape sequences (colours,
// cursor moves) dropped, even one a read cut in two; a line rewritten after "\r"
// (progress bars: tqdm, pip, curl) as it stands last, not every version of it run
// together. write() gives the lines a read ends, open() the line it leaves open.
function terminal() {
  let held = ""; // the start of an escape sequence a read ended in
  let tail = ""; // the line not ended yet, as written ("\r" and all)
  const shown = (line) => {
    const text = line.replace(/\r+$/, "");
    return text.slice(text.lastIndexOf("\r") + 1);
  };
  return {
    write(value) {
      let text = held + value;
      // Held only as long as an escape sequence may be (binary output is text).
      const cut = text.match(/\x1b(\[[0-9;?]{0,30})?$/);
      held = cut ? cut[0] : "";
      if (cut) text = text.slice(0, cut.index);
      const lines = (tail + text.replace(ANSI, "")).split("\n");
      tail = lines.pop();
      // Only its last version is kept of a line rewritten (a bar runs for hours).
      const last = tail.lastIndexOf("\r", tail.length - 2);
      if (last > 0) tail = tail.slice(last);
      if (tail.length > LOG_CHARS) tail = tail.slice(-LOG_CHARS);
      return lines.map((line) => `${shown(line)}\n`).join("");
    },
    open: () => shown(tail),
  };
}

// What a refusal says, as a person reads it: its detail when that is a sentence, each
// item of a validation error (FastAPI's 422: [{loc, msg, ...}]) as "field: message"; it
// showed as the JSON itself.
function explain(status, body) {
  let detail = body;
  if (body && typeof body === "object" && !Array.isArray(body)) detail = body.detail ?? body.message;
  if (typeof detail === "string" && detail.trim()) return detail.trim();
  if (Array.isArray(detail) && detail.length) {
    return detail.map((item) => {
      if (typeof item !== "object" || item === null || !item.msg) return JSON.stringify(item);
      // The first step of loc says where (query, body, path): the field is the rest.
      const field = (item.loc || []).slice(1).join(".");
      return field ? `${field}: ${item.msg}` : item.msg;
    }).join("; ");
  }
  if (detail && typeof detail === "object" && Object.keys(detail).length) return JSON.stringify(detail);
  return `the server answered ${status}`;
}

class ApiError extends Error {
  constructor(status, body) {
    super(explain(status, body));
    this.status = status;
    this.body = body;
  }
}

async function refusal(answer) {
  const type = answer.headers.get("content-type") || "";
  const body = type.includes("json") ? await answer.json().catch(() => null) : await answer.text();
  return new ApiError(answer.status, body);
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${token()}`, ...(options.headers || {}) };
  const answer = await fetch(path, { ...options, headers });
  if (answer.status === 401) {
    if (me) signOut("Your token was refused: sign in again.");
    throw new ApiError(401, {});
  }
  if (!answer.ok) throw await refusal(answer);
  const type = answer.headers.get("content-type") || "";
  return type.includes("json") ? answer.json() : answer.text();
}

// Server-sent events over fetch (EventSource cannot send the Authorization header).
// A feed opened again after it dropped is told as a `reset` (read again): what changed
// while it was down was sent to no one on this page (a job that finished meanwhile
// stayed RUNNING, its Stop and Pause still there).
function listen(path, onEvent) {
  const control = new AbortController();
  (async () => {
    let dropped = false;
    while (!control.signal.aborted) {
      try {
        const answer = await fetch(path, { headers: { Authorization: `Bearer ${token()}` }, signal: control.signal });
        // A token refused is not a server gone away: no retry every 2 s for ever.
        if (answer.status === 401) { signOut("Your token was refused: sign in again."); return; }
        if (answer.status === 403) return;
        if (!answer.ok) throw new Error(`watch answered ${answer.status}`);
        if (dropped) onEvent("reset", {});
        dropped = true; // from here on, an end or an error is a drop
        const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            let type = "message";
            const data = [];
            for (const line of block.split("\n")) {
              if (line.startsWith("event:")) type = line.slice(6).trim();
              else if (line.startsWith("data:")) data.push(line.slice(5).trim());
            }
            if (data.length) onEvent(type, JSON.parse(data.join("\n")));
          }
        }
      } catch (err) {
        if (control.signal.aborted) return;
        dropped = true;
      }
      await new Promise((resolve) => setTimeout(resolve, 2000)); // the server went away: again
    }
  })();
  return () => control.abort();
}

// crypto.randomUUID exists only in secure contexts (HTTPS, localhost); the console may
// be served over plain HTTP elsewhere.
function newKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function when(iso) { return iso ? new Date(iso).toLocaleString() : ""; }
// A time a link carries, kept only when it is one (a hand-edited link's "garbage" threw
// in the list's load, a blank list); ``iso``: as an ISO instant.
function moment(text, iso = false) {
  if (!text || Number.isNaN(new Date(text).getTime())) return "";
  return iso ? new Date(text).toISOString() : text;
}
function badge(state) { return el("span", { class: `state ${state || ""}`, text: state || "…" }); }
function title(text) { document.title = `${text} · Trainyard`; return el("h1", { text }); }
// Said once by a screen reader: the page's one live region (index.html), never the view.
function announce(text) { announcer.textContent = text; }
function notice(text) { return el("p", { class: "notice", role: "status", text }); }
function failed(err) { return el("p", { class: "error", role: "alert", text: `Error: ${err.message}` }); }

// --- sign in ---------------------------------------------------------------------------

function signOut(message) {
  // Everything of the user's in this tab goes, not only the token: a spec they cloned
  // was the next user's at #/submit?clone=1.
  for (const key of Object.keys(sessionStorage)) if (key.startsWith("trainyard.")) sessionStorage.removeItem(key);
  me = null;
  location.hash = "#/login";
  if (message) sessionStorage.setItem("trainyard.message", message);
}

function loginPage() {
  document.getElementById("nav").hidden = true;
  document.getElementById("signout").hidden = true;
  document.getElementById("whoami").textContent = "";
  const message = sessionStorage.getItem("trainyard.message");
  sessionStorage.removeItem("trainyard.message");
  const input = el("input", { id: "token", type: "password", autocomplete: "current-password", required: true, size: 48 });
  const error = el("p", { class: "error", role: "alert" });
  const form = el("form", { class: "card", onsubmit: async (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    try {
      me = await api("/v1/me");
      location.hash = "#/jobs";
    } catch (err) {
      sessionStorage.removeItem(TOKEN_KEY);
      error.textContent = err.status === 401 ? "That token is not valid." : err.message;
    }
  } },
  el("label", { for: "token", text: "Access token" }), input,
  el("p", { class: "muted", text: "An admin gives you one (yard token create <user>); the platform's own is in .data/admin-token." }),
  el("button", { type: "submit", text: "Sign in" }), error);
  view.replaceChildren(title("Sign in"), message ? notice(message) : "", form);
  input.focus();
}

// --- job list --------------------------------------------------------------------------

function jobsPage(params) {
  const filters = {
    state: params.get("state") || "", user: params.get("user") || "", queue: params.get("queue") || "",
    dialect: params.get("dialect") || "", name: params.get("name") || "",
    submitted_after: moment(params.get("after")), submitted_before: moment(params.get("before")),
  };
  // A page after the first goes on from the last row of the page before it (the API's
  // `next` cursor, one for each page turned, kept in the link): jobs that arrive
  // meanwhile go on top and neither shift a later page's rows nor push any past it (an
  // offset counted from the time the list opened skipped those the arrivals pushed off
  // the first page).
  const cursors = (params.get("cursors") || "").split(",").filter(Boolean);
  const page = cursors.length;
  // Jobs newer than this are new since the list was opened (a later page counts them).
  const anchor = moment(params.get("anchor"), true) || new Date().toISOString();
  const body = el("tbody");
  const total = el("span", { class: "muted" });
  const fresh = el("p", { class: "notice", role: "status", hidden: true });
  const rows = new Map();
  const seen = new Set();
  let arrived = 0;
  let pending = null;
  let newest = null;
  function reload() { // many arrivals at once: one load
    if (!pending) pending = setTimeout(() => { pending = null; load(); }, 250);
  }

  function field(name, label, input) {
    input.id = `f-${name}`;
    input.name = name;
    return el("div", {}, el("label", { for: input.id, text: label }), input);
  }
  const stateSelect = el("select", {}, el("option", { value: "", text: "any" }), STATES.map((s) => el("option", { value: s, text: s })));
  stateSelect.value = filters.state;
  const dialectSelect = el("select", {}, el("option", { value: "", text: "any" }), DIALECTS.map((d) => el("option", { value: d, text: d })));
  dialectSelect.value = filters.dialect;
  const form = el("form", { class: "filters", role: "search", onsubmit: (e) => {
    e.preventDefault();
    const data = new FormData(form);
    const next = new URLSearchParams();
    for (const [key, value] of data.entries()) if (value) next.set(key === "submitted_after" ? "after" : key === "submitted_before" ? "before" : key, value);
    location.hash = `#/jobs?${next}`;
  } },
  field("state", "State", stateSelect),
  me?.admin ? field("user", "User", el("input", { value: filters.user, size: 10 })) : "",
  field("queue", "Queue", el("input", { value: filters.queue, size: 10 })),
  field("dialect", "Dialect", dialectSelect),
  field("name", "Name starts with", el("input", { type: "search", value: filters.name, size: 14 })),
  field("submitted_after", "Submitted after", el("input", { type: "datetime-local", value: filters.submitted_after })),
  field("submitted_before", "Submitted before", el("input", { type: "datetime-local", value: filters.submitted_before })),
  el("button", { type: "submit", text: "Filter" }));

  function row(job) {
    const tr = el("tr", { "data-job": job.id },
      el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(job.id)}`, text: job.name || job.id })),
      el("td", { text: job.user || "" }), el("td", { text: job.queue || "" }), el("td", { text: job.dialect || "" }),
      el("td", {}, badge(job.state)), el("td", { text: when(job.submitted_at) }), el("td", { text: job.reason || "" }));
    return tr;
  }
  function matches(job) {
    if (filters.state && job.state !== filters.state) return false;
    for (const key of ["user", "queue", "dialect"]) if (filters[key] && job[key] !== filters[key]) return false;
    if (filters.name && !(job.name || "").startsWith(filters.name)) return false;
    return true;
  }
  let after = null; // this page's `next`: where the one after it starts
  function move(delta) {
    const next = new URLSearchParams(params);
    const turned = delta > 0 ? [...cursors, after] : cursors.slice(0, -1);
    next.delete("page");
    if (turned.length) next.set("cursors", turned.join(","));
    else next.delete("cursors");
    // The newest job the first page showed (the server's clock) is where "new" begins.
    next.set("anchor", page === 0 && newest ? newest.toISOString() : anchor);
    location.hash = `#/jobs?${next}`;
  }
  const prev = el("button", { type: "button", class: "secondary", disabled: page === 0, onclick: () => move(-1), text: "Newer" });
  // (Until the page has loaded, there is no cursor to go on from.)
  const next = el("button", { type: "button", class: "secondary", disabled: true, onclick: () => move(1), text: "Older" });

  async function load() {
    const query = new URLSearchParams({ limit: PAGE });
    for (const [key, value] of Object.entries(filters)) {
      if (!value) continue;
      query.set(key, key.startsWith("submitted_") ? new Date(value).toISOString() : value);
    }
    if (page > 0) query.set("cursor", cursors[page - 1]);
    try {
      const answer = await api(`/v1/jobs?${query}`);
      rows.clear();
      if (page === 0 && answer.items.length) newest = new Date(answer.items[0].submitted_at);
      body.replaceChildren(...answer.items.map((job) => { const tr = row(job); rows.set(job.id, tr); return tr; }));
      if (!answer.items.length) body.append(el("tr", {}, el("td", { colspan: 7, class: "muted", text: "No jobs." })));
      // (An empty list said "0 job(s); 1–0 shown".)
      if (!answer.total) total.textContent = Object.values(filters).some(Boolean) ? "No jobs match." : "No jobs yet.";
      else if (!answer.items.length) total.textContent = `${answer.total} job(s); none on this page`;
      else total.textContent = `${answer.total} job(s); ${page * PAGE + 1}–${page * PAGE + answer.items.length} shown`;
      after = answer.next;
      next.disabled = !after || page * PAGE + answer.items.length >= answer.total;
    } catch (err) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 7 }, failed(err))));
    }
  }
  leave.push(listen("/v1/watch/jobs", (type, job) => {
    if (type === "reset") { load(); return; }
    if (type !== "job") return;
    const known = rows.get(job.id);
    if (known) { const tr = row(job); known.replaceWith(tr); rows.set(job.id, tr); return; }
    // (Compared with the newest job shown, the server's own clock, when there is one.)
    const since = newest || new Date(anchor);
    const at = new Date(job.submitted_at);
    // (On a later page the anchor is the first page's newest job: not new itself.)
    if (!matches(job) || !(page === 0 ? at >= since : at > since) || seen.has(job.id)) return;
    // A job submitted since the list opened: on the first page it goes on top; on a
    // later one it is counted, and the page stays as it is.
    if (page === 0) { reload(); return; }
    seen.add(job.id);
    arrived += 1;
    fresh.hidden = false;
    fresh.replaceChildren(`${arrived} new job(s) since this list was opened. `, el("a", { href: "#/jobs", text: "Show the newest" }));
  }));
  view.replaceChildren(title("Jobs"), form, fresh,
    el("table", {}, el("caption", { class: "muted" }, total),
      el("thead", {}, el("tr", {}, ["Name", "User", "Queue", "Dialect", "State", "Submitted", "Reason"].map((h) => el("th", { scope: "col", text: h })))),
      body),
    el("div", { class: "pager" }, prev, next));
  load();
}

// --- job page --------------------------------------------------------------------------

function jobPage(jobId) {
  const head = el("div");
  const waiting = el("div");
  const attempts = el("div");
  const tasks = el("div");
  const timeline = el("div");
  const logs = el("div");
  const spec = el("div");
  let job = null;
  let following = null;
  leave.push(() => following && following.abort());

  async function act(verb) {
    try {
      await api(`/v1/jobs/${encodeURIComponent(jobId)}/${verb}`, { method: "POST" });
      head.append(el("p", { class: "notice", text: `${verb} requested.` }));
      announce(`${verb[0].toUpperCase()}${verb.slice(1)} requested.`);
    } catch (err) { head.append(failed(err)); }
  }
  function clone() {
    sessionStorage.setItem("trainyard.clone", JSON.stringify(job.original || job.spec));
    location.hash = "#/submit?clone=1";
  }

  function endpoints(task) {
    const links = [];
    for (const port of task.ports || []) {
      for (const number of port.ports || []) {
        // An IPv6 address is bracketed in a URL (else the link goes nowhere).
        const host = String(task.host_ip).includes(":") ? `[${task.host_ip}]` : task.host_ip;
        const address = `${host}:${number}`;
        links.push(el("a", { href: `http://${address}/`, target: "_blank", rel: "noopener noreferrer", text: `${port.label} ${address}` }), " ");
      }
    }
    return links;
  }

  // An interrupted attempt is stored STOPPED: its cause (paused, preempted, scaled, a
  // node removed, restarted) is what tells it from a stop.
  function ended(a) {
    if (!a.interrupted) return a.state || "";
    return `${a.state || "STOPPED"} (${String(a.interrupted).replaceAll("_", " ")})`;
  }

  function render() {
    title(job.name || jobId);
    const command = (verb, text) => ACTIONS[verb].has(job.state)
      ? el("button", { type: "button", class: "secondary", onclick: () => act(verb), text }) : "";
    const actions = el("div", { class: "row", role: "group", "aria-label": "Actions" },
      TERMINAL.has(job.state) ? "" : el("button", { type: "button", onclick: () => act("stop"), text: "Stop" }),
      command("pause", "Pause"), command("resume", "Resume"), command("restart", "Restart"),
      el("button", { type: "button", class: "secondary", onclick: clone, text: "Clone" }));
    const labels = Object.entries(job.labels || {}).map(([key, value]) => `${key}=${value}`);
    head.replaceChildren(el("h1", { text: job.name || jobId }),
      el("div", { class: "card" },
        el("div", { class: "row" }, badge(job.state), el("span", { text: job.reason || "" })),
        el("p", { class: "muted", text: `id ${job.id} · user ${job.user} · queue ${job.queue} · priority ${job.priority} · dialect ${job.dialect} · attempt ${job.attempt} · submitted ${when(job.submitted_at)}${job.finished_at ? ` · finished ${when(job.finished_at)}` : ""}` }),
        labels.length || job.tags?.length ? el("p", { class: "muted", id: "job-labels" },
          labels.length ? `labels ${labels.join(", ")}` : "", labels.length && job.tags?.length ? " · " : "",
          job.tags?.length ? `tags ${job.tags.join(", ")}` : "") : "",
        job.errors?.length ? el("ul", { class: "error" }, job.errors.map((e) => el("li", { text: `${e.path}: ${e.message}` }))) : "",
        job.warnings?.length ? el("ul", {}, job.warnings.map((w) => el("li", { class: "muted", text: `${w.path}: ${w.message}` }))) : "",
        actions));
    if (job.state === "QUEUED" || job.queue_reasons?.length) {
      waiting.replaceChildren(el("h2", { text: "Why it waits" }), el("div", { class: "card" },
        job.queue_position ? el("p", { text: `Position ${job.queue_position} in queue ${job.queue}.` }) : "",
        el("ul", {}, (job.queue_reasons || []).map((r) => el("li", { text: r })))));
    } else waiting.replaceChildren();
    attempts.replaceChildren(el("h2", { text: "Attempts" }), (job.attempts || []).length ? el("table", {},
      el("thead", {}, el("tr", {}, ["Attempt", "State", "Reason", "Failure class", "Exit code"].map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, job.attempts.map((a) => el("tr", {}, el("td", { text: a.attempt }), el("td", { text: ended(a) }),
        el("td", { text: a.reason || "" }), el("td", { text: a.failure_class || "" }), el("td", { text: a.exit_code ?? "" })))))
      : el("p", { class: "muted", text: `Attempt ${job.attempt}, still the first.` }));
    tasks.replaceChildren(el("h2", { text: "Tasks" }), el("table", {},
      el("thead", {}, el("tr", {}, ["Task", "Attempt", "State", "Node", "GPUs", "Started", "Ended", "Exit code", "Failure class", "Endpoints", "Reason"].map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, (job.tasks || []).map((t) => el("tr", {},
        el("td", { text: `${t.role}[${t.index}]` }), el("td", { text: t.attempt ?? "" }), el("td", {}, badge(t.state)),
        el("td", { text: t.node || "" }), el("td", { text: (t.gpu_indices || []).join(", ") }),
        el("td", { text: when(t.started_at) }), el("td", { text: when(t.ended_at) }), el("td", { text: t.exit_code ?? "" }),
        el("td", { text: t.failure_class || "" }), el("td", {}, endpoints(t)), el("td", { text: t.reason || "" }))))));
    renderLogs();
    spec.replaceChildren(el("h2", { text: "Spec" }),
      el("details", { open: true }, el("summary", { text: "Canonical" }), el("pre", { class: "spec", text: JSON.stringify(job.spec, null, 2) })),
      job.original ? el("details", {}, el("summary", { text: `As submitted (${job.dialect})` }), el("pre", { class: "spec", text: JSON.stringify(job.original, null, 2) })) : "");
  }

  let logTask = null;
  const logBox = el("pre", { id: "log", "aria-label": "Task log", tabindex: 0 });
  function renderLogs() {
    if (logs.childElementCount && logTask) return; // keep a followed log as it is
    // Every attempt's tasks (an earlier attempt's log is where its failure is), the
    // latest first.
    const tasks = [...(job.tasks || [])].sort((a, b) => (b.attempt || 1) - (a.attempt || 1));
    const several = new Set(tasks.map((t) => t.attempt || 1)).size > 1;
    if (!tasks.length) { logs.replaceChildren(el("h2", { text: "Logs" }), el("p", { class: "muted", text: "No task has started yet." })); return; }
    const taskSelect = el("select", { id: "log-task" }, tasks.map((t) => el("option", {
      value: `${t.role}/${t.index}/${t.attempt || 1}`,
      text: `${t.role}[${t.index}]${several ? ` attempt ${t.attempt || 1}` : ""}` })));
    const streamSelect = el("select", { id: "log-stream" }, el("option", { value: "stdout", text: "stdout" }), el("option", { value: "stderr", text: "stderr" }));
    const show = el("button", { type: "button", onclick: () => follow(taskSelect.value, streamSelect.value), text: "Show log" });
    logs.replaceChildren(el("h2", { text: "Logs" }), el("div", { class: "row" },
      el("div", {}, el("label", { for: "log-task", text: "Task" }), taskSelect),
      el("div", {}, el("label", { for: "log-stream", text: "Stream" }), streamSelect), show), logBox);
  }
  async function follow(choice, stream) {
    const [role, index, attempt] = choice.split("/");
    logTask = choice;
    if (following) following.abort();
    const mine = following = new AbortController();
    logBox.textContent = "";
    // Only the newest LOG_CHARS are kept on the page: a log of hundreds of MB took
    // some 20 times its size in the browser's memory, and the tab with it.
    let shown = 0;
    let cut = null;
    const term = terminal();
    const open = document.createTextNode(""); // the line not ended yet, always last
    logBox.append(open);
    // Bytes, as the API counts them (a character may be cut in two between reads: the
    // decoder holds its start): a follow that drops goes on from here, nothing twice.
    const decoder = new TextDecoder();
    let offset = 0;
    for (;;) {
      const query = new URLSearchParams({ role, index, attempt, stream, follow: "true", offset });
      try {
        const answer = await fetch(`/v1/jobs/${encodeURIComponent(jobId)}/logs?${query}`, { headers: { Authorization: `Bearer ${token()}` }, signal: mine.signal });
        if (!answer.ok) {
          const error = await refusal(answer);
          if (offset) logBox.append(`\nError: ${error.message}`);
          else logBox.textContent = `Error: ${error.message}`;
          return;
        }
        const reader = answer.body.getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          offset += value.byteLength;
          add(decoder.decode(value, { stream: true }));
        }
        add(decoder.decode());
        logBox.append(el("span", { class: "muted", text: "\n(end of log)" }));
        return;
      } catch (err) {
        if (mine.signal.aborted) return;
      }
      // The connection dropped (the log had not ended): again from the last byte read.
      await new Promise((resolve) => setTimeout(resolve, 2000));
      if (mine.signal.aborted) return;
    }

    function add(value) {
      if (!value) return;
      const atBottom = logBox.scrollHeight - logBox.scrollTop - logBox.clientHeight < 40;
      const text = term.write(value);
      if (text) open.before(text);
      open.data = term.open();
      shown += text.length;
      if (shown > LOG_CHARS) {
        cut = cut || el("span", { class: "muted", text: "(earlier output not shown here)\n" });
        // The oldest text goes, a chunk whole or its start: never the newest (one
        // line may be longer than all that is kept).
        let node = cut.parentNode === logBox ? cut.nextSibling : logBox.firstChild;
        while (shown > LOG_CHARS && node && node !== open) {
          const next = node.nextSibling;
          const excess = shown - LOG_CHARS;
          if (node.nodeType === Node.TEXT_NODE && node.data.length > excess) {
            node.data = node.data.slice(excess);
            shown -= excess;
          } else {
            shown -= node.textContent.length;
            node.remove();
          }
          node = next;
        }
        if (cut.parentNode !== logBox) logBox.prepend(cut);
      }
      if (atBottom) logBox.scrollTop = logBox.scrollHeight; // follow only a reader at the end
    }
  }

  // The history comes a page at a time (a job of many tasks has three events or more
  // each): read up to TIMELINE_PAGES of them, and say so when there are more.
  const TIMELINE_PAGES = 10;
  async function loadEvents() {
    const items = [];
    let after = 0;
    let more = false;
    for (let page = 0; page < TIMELINE_PAGES; page++) {
      const answer = await api(`/v1/jobs/${encodeURIComponent(jobId)}/events?after_seq=${after}`);
      items.push(...answer.items);
      if (answer.next_after_seq == null) { more = false; break; }
      after = answer.next_after_seq;
      more = true;
    }
    timeline.replaceChildren(el("h2", { text: "Timeline" }), el("table", {},
      el("thead", {}, el("tr", {}, ["Time", "Event", "Detail"].map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, items.map((e) => el("tr", {},
        el("td", { text: when(e.occurred_at) }), el("td", { text: e.type }), el("td", { class: "muted", text: describe(e) }))))),
      ...(more ? [el("p", { class: "muted", text: `The first ${items.length} events are shown; the rest: GET /v1/jobs/${jobId}/events?after_seq=${after}.` })] : []));
  }
  let loads = 0;
  async function load() {
    const mine = ++loads; // an answer to an earlier load is older than this one's
    try {
      const answer = await api(`/v1/jobs/${encodeURIComponent(jobId)}`);
      if (mine !== loads) return;
      if (job && job.state !== answer.state) announce(`${answer.name || jobId} is now ${answer.state}.`);
      job = answer;
      render();
      await loadEvents();
    } catch (err) {
      if (mine === loads) head.replaceChildren(el("h1", { text: jobId }), failed(err));
    }
  }
  // This job's changes only (not the whole cluster's feed), and a burst of them read
  // once, as the list does.
  let soon = null;
  leave.push(listen(`/v1/watch/jobs?job_id=${encodeURIComponent(jobId)}`, (type, change) => {
    if (type !== "reset" && change.id !== jobId) return;
    clearTimeout(soon);
    soon = setTimeout(load, 300);
  }));
  leave.push(() => clearTimeout(soon));
  view.replaceChildren(head, waiting, attempts, tasks, logs, timeline, spec);
  load();
}

function describe(event) {
  const e = event.event || {};
  const parts = [];
  for (const key of ["state", "role", "index", "node", "exit_code", "reason", "failure_class", "cause", "position"]) {
    if (e[key] !== undefined && e[key] !== null && e[key] !== "") parts.push(`${key} ${e[key]}`);
  }
  if (Array.isArray(e.reasons) && e.reasons.length) parts.push(e.reasons.join("; "));
  if (Array.isArray(e.errors) && e.errors.length) parts.push(e.errors.map((x) => `${x.path}: ${x.message}`).join("; "));
  return parts.join(" · ");
}

// --- submit ----------------------------------------------------------------------------

function submitPage(params) {
  const error = el("div", { role: "alert" });
  const tabs = el("div", { class: "row tabs", role: "tablist" });
  const panel = el("div", { class: "card", role: "tabpanel" });
  let mode = "form";
  const roles = [];

  // The form: a native job, its fields carrying the JSON path validation names.
  const top = {
    name: el("input", { id: "job-name", "data-path": "$.name", required: true }),
    queue: el("input", { id: "job-queue", "data-path": "$.queue", value: "default" }),
    retry_limit: el("input", { id: "job-retries", type: "number", min: 0, value: 0, "data-path": "$.retry_limit" }),
  };
  const roleBox = el("div");
  function addRole() {
    const i = roles.length;
    const f = (key, label, input) => {
      input.id = `role-${i}-${key}`;
      input.dataset.path = `$.roles[${i}].${key}`;
      return el("div", {}, el("label", { for: input.id, text: label }), input);
    };
    const role = {
      name: el("input", { value: i ? `role${i}` : "worker", size: 10 }),
      replicas: el("input", { type: "number", min: 1, value: 1 }),
      cpu: el("input", { type: "number", min: 0, step: "0.1", value: 1 }),
      memory_mb: el("input", { type: "number", min: 1, value: 1024 }),
      gpu: el("input", { type: "number", min: 0, step: "0.1", value: 0 }),
      gpu_type: el("input", { size: 10, placeholder: "any" }),
      command: el("textarea", { rows: 3, required: true }),
      ports: el("input", { placeholder: "http:1, ssh:1", size: 16 }),
      env: el("textarea", { rows: 2, placeholder: "KEY=value per line" }),
    };
    roles.push(role);
    roleBox.append(el("fieldset", { class: "card" }, el("legend", { text: `Role ${i + 1}` }),
      el("div", { class: "grid" }, f("name", "Role name", role.name), f("replicas", "Replicas", role.replicas),
        f("resources.cpu", "CPUs", role.cpu), f("resources.memory_mb", "Memory (MB)", role.memory_mb),
        f("resources.gpu", "GPUs", role.gpu), f("resources.gpu_type", "GPU type", role.gpu_type),
        f("ports", "Ports (label:count)", role.ports)),
      f("command", "Command", role.command), f("env", "Environment", role.env)));
  }
  addRole();
  function formSpec() {
    return {
      name: top.name.value.trim(), queue: top.queue.value.trim() || "default", retry_limit: Number(top.retry_limit.value || 0),
      roles: roles.map((r) => ({
        name: r.name.value.trim(), replicas: Number(r.replicas.value || 1), command: r.command.value,
        resources: { cpu: Number(r.cpu.value || 0), memory_mb: Number(r.memory_mb.value || 0), gpu: Number(r.gpu.value || 0),
          ...(r.gpu_type.value.trim() ? { gpu_type: r.gpu_type.value.trim() } : {}) },
        ports: r.ports.value.split(",").map((p) => p.trim()).filter(Boolean).map((p) => { const [label, count] = p.split(":"); return { label: label.trim(), count: Number(count || 1) }; }),
        env: r.env.value.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => { const at = l.indexOf("="); return { name: l.slice(0, at < 0 ? l.length : at), value: at < 0 ? "" : l.slice(at + 1) }; }),
      })),
    };
  }
  const formPanel = el("div", {}, el("div", { class: "grid" },
    el("div", {}, el("label", { for: "job-name", text: "Job name" }), top.name),
    el("div", {}, el("label", { for: "job-queue", text: "Queue" }), top.queue),
    el("div", {}, el("label", { for: "job-retries", text: "Retries" }), top.retry_limit)),
    roleBox, el("button", { type: "button", class: "secondary", onclick: addRole, text: "Add a role" }));

  // Paste, or import a file into the same text: any dialect, JSON or YAML.
  const text = el("textarea", { id: "job-text", rows: 18, spellcheck: "false", "data-path": "$" });
  const file = el("input", { id: "job-file", type: "file", accept: ".json,.yaml,.yml,application/json", onchange: async () => {
    if (file.files.length) text.value = await file.files[0].text();
  } });
  const dialect = el("select", { id: "job-dialect" }, el("option", { value: "", text: "detect" }), DIALECTS.map((d) => el("option", { value: d, text: d })));
  const textPanel = el("div", {},
    el("div", { class: "row" }, el("div", {}, el("label", { for: "job-file", text: "Import a file" }), file),
      el("div", {}, el("label", { for: "job-dialect", text: "Dialect" }), dialect)),
    el("label", { for: "job-text", text: "Job (JSON or YAML, in any dialect)" }), text);

  const clone = params.get("clone") && sessionStorage.getItem("trainyard.clone");
  if (clone) { text.value = JSON.stringify(JSON.parse(clone), null, 2); mode = "text"; }
  // A job's view hides its secrets' values: a clone must have them written again (the
  // platform refuses the mask as a value).
  const masked = clone && clone.includes('"******"')
    ? notice("This job's secret values are hidden (******): write them again before submitting.") : "";

  function show(which) {
    mode = which;
    for (const b of tabs.children) b.setAttribute("aria-selected", String(b.dataset.mode === which));
    panel.replaceChildren(which === "form" ? formPanel : textPanel);
  }
  tabs.append(el("button", { type: "button", role: "tab", "data-mode": "form", onclick: () => show("form"), text: "Fill a form" }),
    el("button", { type: "button", role: "tab", "data-mode": "text", onclick: () => show("text"), text: "Paste or import" }));

  function request() {
    if (mode === "form") return { body: JSON.stringify(formSpec()), type: "application/json", query: "" };
    const raw = text.value.trim();
    const type = raw.startsWith("{") || raw.startsWith("[") ? "application/json" : "application/yaml";
    return { body: raw, type, query: dialect.value ? `?dialect=${encodeURIComponent(dialect.value)}` : "" };
  }
  function clearErrors() {
    for (const old of view.querySelectorAll(".field-error")) old.remove();
    for (const input of view.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
    error.replaceChildren();
  }
  function showErrors(errors) {
    const left = [];
    for (const e of errors) {
      const input = [...view.querySelectorAll("[data-path]")].find((i) => i.dataset.path === e.path)
        || (mode === "text" ? text : null);
      if (input && input.offsetParent !== null) {
        const note = el("p", { class: "error field-error", id: `err-${Math.random().toString(36).slice(2)}`, text: `${e.path}: ${e.message}` });
        input.setAttribute("aria-invalid", "true");
        input.setAttribute("aria-describedby", note.id);
        input.after(note);
      } else left.push(e);
    }
    if (left.length) error.append(el("ul", { class: "error" }, left.map((e) => el("li", { text: `${e.path}: ${e.message}` }))));
  }
  async function check() {
    clearErrors();
    const r = request();
    try {
      const answer = await api(`/v1/jobs:validate${r.query}`, { method: "POST", body: r.body, headers: { "Content-Type": r.type } });
      if (answer.valid) error.replaceChildren(notice(`Valid (${answer.dialect}); ${answer.warnings.length} warning(s).`));
      else showErrors(answer.errors);
      return answer.valid;
    } catch (err) { error.replaceChildren(failed(err)); return false; }
  }
  // One job per submission: a double click, or a retry after an answer that was lost,
  // is the same one (its Idempotency-Key, kept while the body is unchanged), and the
  // buttons wait for the answer. An edited body is a new submission, a new key.
  let key = null;
  let keyed = null;
  const checkButton = el("button", { type: "button", class: "secondary", onclick: () => busy(check), text: "Check (dry run)" });
  const submitButton = el("button", { type: "button", onclick: () => busy(submit), text: "Submit" });
  async function busy(action) {
    if (submitButton.disabled) return;
    checkButton.disabled = submitButton.disabled = true;
    try { await action(); } finally { checkButton.disabled = submitButton.disabled = false; }
  }
  async function submit() {
    if (!(await check())) return;
    const r = request();
    if (keyed !== `${r.query}\n${r.body}`) { keyed = `${r.query}\n${r.body}`; key = newKey(); }
    try {
      const answer = await api(`/v1/jobs${r.query}`, { method: "POST", body: r.body, headers: { "Content-Type": r.type, "Idempotency-Key": key } });
      sessionStorage.removeItem("trainyard.clone");
      location.hash = `#/jobs/${encodeURIComponent(answer.id)}`;
    } catch (err) { error.replaceChildren(failed(err)); }
  }
  view.replaceChildren(title("Submit a job"), masked, tabs, panel, error,
    el("div", { class: "row" }, checkButton, submitButton));
  show(mode);
}

// --- cluster ---------------------------------------------------------------------------

async function clusterPage() {
  view.replaceChildren(title("Cluster"), el("p", { class: "muted", text: "Loading…" }));
  try {
    const [cluster, jobs] = await Promise.all([api("/v1/placement/cluster"), api("/v1/jobs?limit=1&counts=true")]);
    // The key figures at a glance (what the Grafana dashboard charts over time).
    const gpus = cluster.nodes.reduce((n, node) => n + node.capacity.gpus, 0);
    const held = cluster.nodes.reduce((n, node) => n + node.allocated.gpus, 0);
    // The caller's own jobs, as the counts by state beside it are (docs/security.md; an
    // admin's: every job): the queues' sum was every user's. The Waiting column of the
    // queues below is the cluster's.
    // Each state counted up to 10,000 (the API's 10,001: more than that).
    const many = (n) => (n > 10000 ? "over 10,000" : String(n));
    // A state the count's time ran out before (counts_exact false) is not there: not a 0.
    const waiting = jobs.counts?.QUEUED ?? (jobs.counts_exact === false ? null : 0);
    const figures = el("dl", { class: "grid card", id: "figures" },
      [["GPUs in use", `${held} of ${gpus}${gpus ? ` (${Math.round((100 * held) / gpus)}%)` : ""}`],
        ["Jobs waiting", waiting === null ? "not counted in time" : many(waiting)],
        ...STATES.filter((st) => st !== "QUEUED" && jobs.counts?.[st]).map((st) => [`Jobs ${st.toLowerCase()}`, many(jobs.counts[st])])]
        .map(([term, value]) => el("div", {}, el("dt", { class: "muted", text: term }), el("dd", { text: value }))));
    const nodes = el("table", {},
      el("thead", {}, el("tr", {}, ["Node", "State", "GPUs", "CPU used / total", "Memory used / total (MB)", "Held by"].map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, cluster.nodes.map((n) => {
        const held = new Map();
        for (const t of n.tasks) for (const g of t.gpu_indices) held.set(g, t);
        const gpus = [];
        for (let g = 0; g < n.capacity.gpus; g++) {
          const t = held.get(g);
          gpus.push(el("span", { class: `gpu ${t ? (t.job_id ? "held" : "other") : ""}`, title: t ? (t.job_id ? `${t.user} ${t.task} (${t.queue})` : `another user's job (${t.queue})`) : "free", text: g }));
        }
        return el("tr", {}, el("td", { text: `${n.name}${n.gpu_type ? ` (${n.gpu_type})` : ""}` }), el("td", { text: n.state }),
          el("td", {}, gpus.length ? gpus : el("span", { class: "muted", text: "none" })),
          el("td", { text: `${n.allocated.cpu} / ${n.capacity.cpu}` }), el("td", { text: `${n.allocated.memory_mb} / ${n.capacity.memory_mb}` }),
          el("td", {}, el("ul", {}, n.tasks.map((t) => el("li", {}, t.job_id ? el("a", { href: `#/jobs/${encodeURIComponent(t.job_id)}`, text: `${t.user} ${t.task}` }) : "another user's job", ` · ${t.queue}`)))));
      })));
    const quota = (q) => Object.entries(q).filter(([, v]) => v !== null).map(([k, v]) => `${k} ${v}`).join(", ") || "no limit";
    const queues = el("table", {},
      el("thead", {}, el("tr", {}, ["Queue", "Quota", "CPU", "Memory (MB)", "GPUs", "Waiting"].map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, cluster.queues.map((q) => el("tr", {}, el("td", {}, el("a", { href: `#/jobs?queue=${encodeURIComponent(q.name)}`, text: q.name })),
        el("td", { text: quota(q.quota) }), el("td", { text: q.used.cpu }), el("td", { text: q.used.memory_mb }), el("td", { text: q.used.gpus }), el("td", { text: q.waiting })))));
    view.replaceChildren(title("Cluster"), figures, el("h2", { text: "Nodes" }), nodes, el("h2", { text: "Queues" }), queues);
  } catch (err) {
    view.replaceChildren(title("Cluster"), failed(err));
  }
}

// --- routing ---------------------------------------------------------------------------

async function route() {
  for (const stop of leave) stop();
  leave = [];
  announce("");
  const [path, query] = (location.hash.slice(1) || "/jobs").split("?");
  const params = new URLSearchParams(query || "");
  if (!token() || path === "/login") { loginPage(); return; }
  if (!me) {
    try { me = await api("/v1/me"); } catch (err) {
      // A token refused after a reload (revoked, a new platform) signs out; anything
      // else says so with a way to try again, never a blank page.
      if (err.status === 401) { signOut("Your token was refused: sign in again."); return; }
      view.replaceChildren(title("Trainyard"), failed(err),
        el("button", { type: "button", onclick: route, text: "Try again" }));
      document.getElementById("signout").hidden = false;
      return;
    }
  }
  document.getElementById("nav").hidden = false;
  document.getElementById("signout").hidden = false;
  document.getElementById("whoami").textContent = `${me.user}${me.admin ? " (admin)" : ""}`;
  for (const a of document.querySelectorAll("nav a")) {
    if (path.startsWith(a.getAttribute("href").slice(1))) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const job = path.match(/^\/jobs\/(.+)$/);
  if (job) {
    let id = null;
    try { id = decodeURIComponent(job[1]); } catch { /* a malformed link */ }
    if (id === null) view.replaceChildren(title("Job"), failed(new Error("that link names no job")));
    else jobPage(id);
  }
  else if (path === "/submit") submitPage(params);
  else if (path === "/cluster") clusterPage();
  else jobsPage(params);
  view.focus();
}

document.getElementById("signout").addEventListener("click", () => signOut());
window.addEventListener("hashchange", route);
route();
