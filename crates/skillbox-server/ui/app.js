// skillbox's UI: plain JavaScript over the HTTP API (DESIGN.md §5.3). Everything
// shown that a model or a script wrote (prompts, scripts, stderr, file names, slide
// text) goes into the page as text, never as HTML.
"use strict";

const KEY = "skillbox.apiKey";
const PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation";
const POLL_MS = 1000;

const $ = (id) => document.getElementById(id);

/** An element with text and attributes; children appended in order. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function key() {
  return sessionStorage.getItem(KEY) || "";
}

/** fetch() with the key; an error answer becomes an ApiError with the server's words. */
async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = Object.assign({}, opts.headers || {});
  if (key()) opts.headers["Authorization"] = "Bearer " + key();
  const response = await fetch(path, opts);
  if (response.ok) return response;
  let code = "unknown";
  let message = response.status + " " + response.statusText;
  try {
    const body = await response.json();
    if (body && body.error) {
      code = body.error.code;
      message = body.error.message;
    }
  } catch (_) {
    // Not JSON: the status line says it.
  }
  throw new ApiError(response.status, code, message);
}

async function apiJson(path, options) {
  return (await api(path, options)).json();
}

// ---- views ----------------------------------------------------------------------

const VIEWS = ["login", "runs", "new", "run"];
let stopPolling = null;

function show(view, title) {
  for (const name of VIEWS) $("view-" + name).hidden = name !== view;
  $("nav").hidden = view === "login";
  for (const [link, current] of [["nav-runs", view === "runs"], ["nav-new", view === "new"]]) {
    if (current) $(link).setAttribute("aria-current", "page");
    else $(link).removeAttribute("aria-current");
  }
  document.title = title ? title + " · skillbox" : "skillbox";
}

function say(text) {
  $("status").textContent = text || "";
}

function focusHeading(id) {
  const heading = $(id);
  if (heading) heading.focus({ preventScroll: false });
}

/** Handles an error of any view: a refused key goes back to the login form. */
function failed(error) {
  if (error instanceof ApiError && error.status === 401) {
    sessionStorage.removeItem(KEY);
    location.hash = "#/login";
    $("login-error").textContent = "Sign in with an API key of this server.";
    return;
  }
  say(error instanceof ApiError ? error.code + ": " + error.message : String(error));
}

async function route() {
  if (stopPolling) {
    stopPolling();
    stopPolling = null;
  }
  say("");
  const hash = location.hash || "#/runs";
  try {
    if (hash === "#/login") return showLogin();
    if (hash === "#/new") return await showNew();
    const run = hash.match(/^#\/runs\/([0-9a-zA-Z_-]+)$/);
    if (run) return await showRun(run[1]);
    return await showRuns();
  } catch (error) {
    failed(error);
  }
}

// ---- login ------------------------------------------------------------------------

function showLogin() {
  show("login", "Sign in");
  $("api-key").focus();
}

async function signIn(event) {
  event.preventDefault();
  const typed = $("api-key").value.trim();
  $("login-error").textContent = "";
  if (typed) sessionStorage.setItem(KEY, typed);
  else sessionStorage.removeItem(KEY);
  try {
    await api("/v1/agent/runs?limit=1");
  } catch (error) {
    sessionStorage.removeItem(KEY);
    $("login-error").textContent =
      error instanceof ApiError && error.status === 401
        ? (typed ? "This key is not known to this server." : "This server needs an API key.")
        : "Cannot reach the API: " + error.message;
    $("api-key").focus();
    return;
  }
  $("api-key").value = "";
  location.hash = "#/runs";
}

function signOut() {
  sessionStorage.removeItem(KEY);
  location.hash = "#/login";
}

// ---- runs -------------------------------------------------------------------------

function duration(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return ms + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  return Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
}

function when(ms) {
  return new Date(ms).toLocaleString();
}

function runItem(run) {
  const files = run.artifacts.map((a) => a.path).join(", ");
  const meta = [
    run.backend,
    run.model + (run.scripted ? " (scripted)" : ""),
    run.attempts + (run.attempts === 1 ? " attempt" : " attempts"),
    run.durationMs === null || run.durationMs === undefined ? "running" : duration(run.durationMs),
    files ? "files: " + files : "no files",
    when(run.createdMs),
  ].join(" · ");
  return el(
    "li",
    {},
    el(
      "a",
      { href: "#/runs/" + run.id, "data-run": run.id },
      el("span", { class: "badge " + run.status, text: run.status }),
      el("span", { class: "prompt", text: run.prompt }),
      el("span", { class: "meta", text: meta }),
    ),
  );
}

let nextPage = null;
let nextPlain = null;

function plainItem(run) {
  const ended = run.timedOut
    ? "timed out"
    : run.limitHit
      ? "limit: " + run.limitHit
      : run.signal
        ? "signal " + run.signal
        : "exit " + run.exitCode;
  const ok = run.exitCode === 0 && !run.timedOut && !run.limitHit;
  const files = el("span", { class: "files" });
  for (const artifact of run.files) {
    const button = el("button", { type: "button", class: "link", text: "Download " + artifact.path });
    button.addEventListener("click", () => download(artifact, button));
    files.append(button);
  }
  const meta = [run.language, run.backend, ended, duration(run.durationMs), when(run.createdMs)].join(" · ");
  return el(
    "li",
    {},
    el(
      "div",
      { class: "plain", "data-plain-run": run.id },
      el("span", { class: "badge " + (ok ? "ok" : "bad"), text: ok ? "ok" : "failed" }),
      el("span", { class: "prompt", text: run.script || "(empty script)" }),
      el("span", { class: "meta", text: meta }),
      run.files.length ? files : null,
    ),
  );
}

async function loadPlain(before) {
  const query = before ? "?limit=20&before=" + encodeURIComponent(before) : "?limit=20";
  const page = await apiJson("/v1/runs" + query);
  const list = $("plain-list");
  if (!before) list.replaceChildren();
  for (const run of page.runs) list.append(plainItem(run));
  nextPlain = page.next || null;
  $("plain-more").hidden = !nextPlain;
  $("plain-empty").hidden = list.children.length > 0;
}

async function loadRuns(before) {
  const query = before ? "?limit=20&before=" + encodeURIComponent(before) : "?limit=20";
  const page = await apiJson("/v1/agent/runs" + query);
  const list = $("runs-list");
  if (!before) list.replaceChildren();
  for (const run of page.runs) list.append(runItem(run));
  nextPage = page.next || null;
  $("runs-more").hidden = !nextPage;
  $("runs-empty").hidden = list.children.length > 0;
}

async function showRuns() {
  show("runs", "Runs");
  await Promise.all([loadRuns(null), loadPlain(null)]);
  focusHeading("runs-title");
}

// ---- new run ----------------------------------------------------------------------

let agentInfo = null;

async function showNew() {
  show("new", "New run");
  if (!agentInfo) {
    agentInfo = await apiJson("/v1/agent");
    const select = $("skill");
    select.replaceChildren(...agentInfo.skills.map((s) => el("option", { value: s, text: s })));
  }
  $("model-name").textContent = agentInfo.model;
  $("model-note").textContent = agentInfo.scripted
    ? "— the loopback demo: a recorded session replayed, no real model (start the server with --model openai for one)."
    : "— as the server was started (--model).";
  focusHeading("new-title");
}

async function startRun(event) {
  event.preventDefault();
  $("new-error").textContent = "";
  const button = $("start");
  button.disabled = true;
  const body = {
    prompt: $("prompt").value,
    skill: $("skill").value || undefined,
    backend: $("backend").value,
    maxAttempts: Number($("max-attempts").value),
  };
  try {
    const created = await apiJson("/v1/agent/runs", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    location.hash = "#/runs/" + created.id;
  } catch (error) {
    if (error instanceof ApiError && error.status !== 401) {
      $("new-error").textContent = error.code + ": " + error.message;
    } else {
      failed(error);
    }
  } finally {
    button.disabled = false;
  }
}

// ---- one run ----------------------------------------------------------------------

const KEYWORDS = new Set(
  (
    "const let var function return if else for while do new await async of in class " +
    "import from export try catch finally throw true false null undefined this require " +
    "def elif lambda with as pass None True False and or not is print then fi done esac " +
    "case echo exit"
  ).split(" "),
);

/** The script as highlighted text nodes: comments, strings, numbers, keywords. */
function highlight(script, language) {
  const hashComments = language === "python" || language === "sh";
  const pattern = hashComments
    ? /(#[^\n]*)|("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')|(\b\d+(?:\.\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)/g
    : /(\/\/[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`(?:\\.|[^`\\])*`)|(\b\d+(?:\.\d+)?\b)|([A-Za-z_$][A-Za-z0-9_$]*)/g;
  const code = el("code", { class: "language-" + language });
  let at = 0;
  for (const match of script.matchAll(pattern)) {
    const [text, comment, string, number, word] = match;
    const kind = comment ? "c" : string ? "s" : number ? "n" : word && KEYWORDS.has(word) ? "k" : null;
    if (!kind) continue;
    if (match.index > at) code.append(script.slice(at, match.index));
    code.append(el("span", { class: "tok-" + kind, text }));
    at = match.index + text.length;
  }
  code.append(script.slice(at));
  return code;
}

function verificationText(attempt) {
  if (!attempt.verification.length) return attempt.files.length ? "no deck to verify" : "no files";
  return attempt.verification
    .map((v) => v.path + ": " + (v.ok ? v.slides + " slides, verified" : "failed: " + v.error))
    .join("; ");
}

function attemptItem(attempt) {
  const exit =
    attempt.timedOut ? "timed out" : attempt.signal ? "signal " + attempt.signal : "exit " + attempt.exitCode;
  const item = el(
    "li",
    { class: "attempt", "data-attempt": attempt.number, "data-succeeded": String(attempt.succeeded) },
    el(
      "h3",
      {},
      el("span", { text: "Attempt " + attempt.number }),
      el("span", { class: "badge " + (attempt.succeeded ? "ok" : "bad"), text: attempt.succeeded ? "ok" : "failed" }),
      el("span", { class: "mono", text: exit }),
      el("span", { text: duration(attempt.durationMs) }),
    ),
    el("p", { class: "verification", text: "Verification: " + verificationText(attempt) }),
    el("h4", { text: "Script (" + attempt.language + ")" }),
    el("pre", { class: "script", tabindex: "0", "aria-label": "Script of attempt " + attempt.number }, highlight(attempt.script, attempt.language)),
  );
  if (attempt.stderr) {
    item.append(
      el("h4", { text: attempt.succeeded ? "stderr" : "stderr (sent back to the model)" }),
      el("pre", { class: "stderr", tabindex: "0", text: attempt.stderr }),
    );
  }
  return item;
}

function fact(list, name, value) {
  list.append(el("dt", { text: name }), el("dd", {}, value));
}

/** Downloads an artifact with the key (a plain link could not send it). */
async function download(artifact, button) {
  button.disabled = true;
  try {
    const blob = await (await api(artifact.url)).blob();
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: artifact.path.split("/").pop() });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } catch (error) {
    failed(error);
  } finally {
    button.disabled = false;
  }
}

function isDeck(artifact) {
  return artifact.contentType === PPTX || artifact.path.toLowerCase().endsWith(".pptx");
}

/** The deck's slides; `alive` turns false once the reader left the page (or signed out). */
async function showSlides(artifact, alive) {
  const preview = await apiJson("/v1/objects/" + artifact.sha256 + "/slides");
  if (!alive()) return;
  const list = $("slides");
  list.replaceChildren();
  $("slides-title").textContent = "Slides of " + artifact.path;
  $("slides-note").textContent =
    preview.format === "png"
      ? "Rendered on the server by LibreOffice."
      : "Text outlines (" + (preview.note || "no render") + ").";
  $("slides-block").hidden = false;
  list.dataset.format = preview.format;
  for (const slide of preview.slides) {
    const label = "Slide " + slide.number + (slide.texts.length ? ": " + slide.texts[0] : "");
    const figure = el("figure", { class: "slide", "data-slide": slide.number });
    if (slide.image) {
      const img = el("img", { alt: label, width: "500", height: "281" });
      figure.append(img);
      Promise.resolve()
        .then(() => (alive() ? api(slide.image) : Promise.reject(new Error("left"))))
        .then((r) => r.blob())
        .then((blob) => {
          img.src = URL.createObjectURL(blob);
        })
        .catch((error) => {
          if (alive()) failed(error);
        });
      figure.append(el("figcaption", { text: label }));
    } else {
      figure.append(
        el("figcaption", { text: "Slide " + slide.number }),
        el("ul", {}, ...slide.texts.map((t) => el("li", { text: t }))),
      );
    }
    list.append(el("li", {}, figure));
  }
}

function renderRun(run) {
  $("run-title").textContent = run.prompt;
  const facts = $("run-facts");
  facts.replaceChildren();
  fact(facts, "Status", el("span", { class: "badge " + run.status, id: "run-status", text: run.status }));
  fact(facts, "Run", el("span", { class: "mono", text: run.id }));
  fact(facts, "Skill", run.skill);
  fact(facts, "Backend", run.backend);
  fact(facts, "Model", run.model + (run.scripted ? " (scripted: the loopback demo)" : ""));
  fact(facts, "Attempts", run.attempts.length + " (at most " + run.maxAttempts + " failed)");
  $("run-reason").textContent = run.reason ? "Ended: " + run.reason : "";
  const list = $("attempts");
  // Attempts only ever grow: add the new ones, keep what a reader has scrolled to.
  for (const attempt of run.attempts.slice(list.children.length)) list.append(attemptItem(attempt));
  $("attempts-empty").hidden = run.attempts.length > 0 || run.status !== "running";
  const artifacts = $("artifacts");
  artifacts.replaceChildren(
    ...run.artifacts.map((artifact) => {
      const button = el("button", { type: "button", class: "link", text: "Download " + artifact.path });
      button.addEventListener("click", () => download(artifact, button));
      return el("li", {}, button, " ", el("span", { class: "help", text: artifact.size + " bytes · " + artifact.contentType }));
    }),
  );
  $("artifacts-block").hidden = run.artifacts.length === 0;
}

async function showRun(id) {
  show("run", "Run");
  $("attempts").replaceChildren();
  $("slides").replaceChildren();
  $("slides-block").hidden = true;
  $("artifacts-block").hidden = true;
  let stopped = false;
  let timer = null;
  stopPolling = () => {
    stopped = true;
    clearTimeout(timer);
  };
  const run = await apiJson("/v1/agent/runs/" + encodeURIComponent(id));
  renderRun(run);
  focusHeading("run-title");
  let current = run;
  while (current.status === "running" && !stopped) {
    say("Running: attempt " + (current.attempts.length + 1) + " …");
    await new Promise((resolve) => {
      timer = setTimeout(resolve, POLL_MS);
    });
    if (stopped) return;
    current = await apiJson("/v1/agent/runs/" + encodeURIComponent(id));
    renderRun(current);
  }
  if (stopped) return;
  say(current.status === "succeeded" ? "The run succeeded." : "The run " + current.status + ".");
  const deck = current.artifacts.find(isDeck);
  if (deck) await showSlides(deck, () => !stopped);
}

// ---- start ------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", signIn);
  $("new-form").addEventListener("submit", startRun);
  $("sign-out").addEventListener("click", signOut);
  $("runs-more").addEventListener("click", () => loadRuns(nextPage).catch(failed));
  $("plain-more").addEventListener("click", () => loadPlain(nextPlain).catch(failed));
  window.addEventListener("hashchange", route);
  route();
});
