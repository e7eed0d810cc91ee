// The review page: upload documents, follow them, and check each page's transcript against its image.
//
// Transcripts are untrusted model output: they are rendered by marked, then sanitised by DOMPurify into a DOM
// fragment; the raw view and every other value is set as text. All URLs are relative to the page (deployed, API
// Gateway serves it under its stage, e.g. /v1/review), and every data call carries the key the user typed in.

const { DOMPurify, marked } = window;

const KEY_STORAGE = "pagescribe.apiKey";
const FINISHED = new Set(["COMPLETED", "PARTIAL", "FAILED"]);
const POLL_MS = 1000;
const CONTENT_TYPES = {
  pdf: "application/pdf",
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  tif: "image/tiff",
  tiff: "image/tiff",
  webp: "image/webp",
};
const SANITIZE = {
  RETURN_DOM_FRAGMENT: true,
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option"],
  FORBID_ATTR: ["style"],
};

const $ = (id) => document.getElementById(id);

class ApiFailure extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// --- API ------------------------------------------------------------------------------------------------------------

function apiUrl(path) {
  return new URL(path, document.baseURI).href;
}

async function call(method, path, body) {
  const headers = { "x-api-key": sessionStorage.getItem(KEY_STORAGE) || "" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(apiUrl(path), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
  });
  const text = await response.text();
  if (response.status === 401 || response.status === 403) {
    sessionStorage.removeItem(KEY_STORAGE);
    showLogin(messageOf(text) || "the key was refused");
    throw new ApiFailure(response.status, messageOf(text) || "the key was refused");
  }
  if (!response.ok) throw new ApiFailure(response.status, messageOf(text) || `HTTP ${response.status}`);
  return { text, json: () => JSON.parse(text) };
}

function messageOf(text) {
  try {
    return JSON.parse(text).message || "";
  } catch {
    return "";
  }
}

const wait = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function pollDocument(id, onStatus) {
  for (;;) {
    const status = (await call("GET", `documents/${encodeURIComponent(id)}`)).json();
    onStatus(status);
    if (FINISHED.has(status.status)) return status;
    await wait(POLL_MS);
  }
}

// --- small helpers --------------------------------------------------------------------------------------------------

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function usd(value) {
  return `$${Number(value || 0).toFixed(value && value < 0.01 ? 6 : 4)}`;
}

function number(value) {
  return Number.isInteger(value) ? String(value) : Number(value).toPrecision(4).replace(/\.?0+$/, "");
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

function setStatus(node, status) {
  node.textContent = status;
  node.dataset.status = status;
  node.className = `status status-${status.toLowerCase()}`;
}

function show(id, visible) {
  $(id).hidden = !visible;
}

function notice(text, kind) {
  const node = $("notice");
  node.textContent = text;
  node.className = `notice ${kind || ""}`;
  node.hidden = !text;
}

// --- sign in --------------------------------------------------------------------------------------------------------

function showLogin(error) {
  for (const id of ["home", "document", "session"]) show(id, false);
  show("login", true);
  $("login-error").textContent = error || "";
  show("login-error", Boolean(error));
  $("api-key").focus();
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
  try {
    await call("GET", "documents?limit=1");
  } catch (failure) {
    if (!(failure instanceof ApiFailure) || failure.status > 403) showLogin(failure.message);
    return;
  }
  $("api-key").value = "";
  route();
});

$("forget-key").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORAGE);
  showLogin("");
});

// --- uploads --------------------------------------------------------------------------------------------------------

function contentType(file) {
  if (Object.values(CONTENT_TYPES).includes(file.type)) return file.type;
  return CONTENT_TYPES[(file.name.split(".").pop() || "").toLowerCase()] || "application/pdf";
}

function uploadRow(file) {
  const row = element("li", undefined, "upload");
  const name = element("span", file.name, "name");
  const state = element("span", "", "status");
  setStatus(state, "UPLOADING");
  const bar = element("progress");
  bar.max = 1;
  bar.value = 0;
  const counts = element("span", "uploading…", "counts muted");
  row.append(name, state, bar, counts);
  $("uploads").prepend(row);
  return { row, state, bar, counts };
}

function showProgress(view, status) {
  const pages = status.pages || {};
  const done = pages.COMPLETED || 0;
  const failed = (pages.FAILED || 0) + (pages.SKIPPED || 0);
  setStatus(view.state, status.status);
  view.row.dataset.status = status.status;
  view.bar.max = Math.max(1, status.page_count);
  view.bar.value = done + failed;
  const pagesOf = (list) => (list.length ? ` (p. ${list.map((p) => p.page).join(", ")})` : "");
  const parts = [`${done} of ${status.page_count || "?"} pages done`];
  parts.push(`${failed} failed${pagesOf(status.page_errors || [])}`);
  parts.push(`${status.flagged_pages} flagged${pagesOf(status.page_flags || [])}`);
  view.counts.textContent = parts.join(" · ");
  view.row.dataset.done = String(done);
  view.row.dataset.failed = String(failed);
  view.row.dataset.flagged = String(status.flagged_pages);
}

async function upload(file) {
  const view = uploadRow(file);
  try {
    const type = contentType(file);
    const created = (await call("POST", "documents", { filename: file.name, content_type: type })).json();
    view.row.dataset.documentId = created.document_id;
    const put = await fetch(created.upload_url, { method: "PUT", headers: created.upload_headers, body: file });
    if (!put.ok) throw new ApiFailure(put.status, `the upload was refused (HTTP ${put.status})`);
    setStatus(view.state, "PROCESSING");
    view.counts.textContent = "reading the file…";
    const status = await pollDocument(created.document_id, (s) => showProgress(view, s));
    const open = element("a", "Open", "button");
    open.href = `#doc/${encodeURIComponent(created.document_id)}`;
    view.row.append(open);
    if (status.error) view.counts.textContent += ` · ${status.error}`;
  } catch (failure) {
    setStatus(view.state, "ERROR");
    view.row.dataset.status = "ERROR";
    view.counts.textContent = failure.message;
  }
  loadDocuments();
}

function uploadAll(files) {
  for (const file of files) upload(file);
}

$("file-input").addEventListener("change", (event) => {
  uploadAll([...event.target.files]);
  event.target.value = "";
});

const drop = $("drop");
drop.addEventListener("dragover", (event) => {
  event.preventDefault();
  drop.classList.add("over");
});
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (event) => {
  event.preventDefault();
  drop.classList.remove("over");
  uploadAll([...event.dataTransfer.files]);
});

// --- the documents --------------------------------------------------------------------------------------------------

let nextCursor = null;

async function loadDocuments(cursor) {
  const query = new URLSearchParams({ limit: "20" });
  if (cursor) query.set("cursor", cursor);
  let listed;
  try {
    listed = (await call("GET", `documents?${query}`)).json();
  } catch (failure) {
    $("list-error").textContent = failure.message;
    show("list-error", true);
    return;
  }
  show("list-error", false);
  const body = $("documents").tBodies[0];
  if (!cursor) body.replaceChildren();
  for (const doc of listed.documents) body.append(documentRow(doc));
  nextCursor = listed.next_cursor;
  show("more", Boolean(nextCursor));
  show("no-documents", body.rows.length === 0);
}

function documentRow(doc) {
  const row = element("tr");
  row.dataset.documentId = doc.document_id;
  const link = element("a", doc.filename || doc.document_id);
  link.href = `#doc/${encodeURIComponent(doc.document_id)}`;
  const name = element("td");
  name.append(link);
  const state = element("td");
  const badge = element("span");
  setStatus(badge, doc.status);
  state.append(badge);
  const failed = doc.pages_failed ? ` (${doc.pages_failed} failed)` : "";
  const cells = [
    element("td", `${doc.pages_completed}/${doc.page_count}${failed}`),
    element("td", doc.flagged || "", doc.flagged ? "flagged-count" : ""),
    element("td", usd(doc.cost), "num"),
    element("td", when(doc.created_at), "muted"),
  ];
  ["pages", "flags", "cost", "created"].forEach((label, at) => {
    cells[at].dataset.label = label; // shown before the value where the table is a list of cards (narrow screens)
  });
  row.append(name, state, ...cells);
  return row;
}

$("refresh").addEventListener("click", () => loadDocuments());
$("more").addEventListener("click", () => loadDocuments(nextCursor));

// --- one document ---------------------------------------------------------------------------------------------------

const review = {
  id: null,
  status: null,
  pages: [],
  current: 1,
  raw: false,
  blobs: [],
  loading: 0,
};

function doubtful(page) {
  return (page.flags && page.flags.length > 0) || page.status !== "COMPLETED";
}

async function openDocument(id, pageNumber) {
  if (review.id === id && review.pages.length) {
    showPage(pageNumber || review.current);
    return;
  }
  Object.assign(review, { id, status: null, pages: [], current: pageNumber || 1, raw: false });
  $("doc-title").textContent = id;
  $("page-strip").replaceChildren();
  show("page-view", false);
  notice("", "");
  await loadDocument();
}

async function loadDocument() {
  const id = review.id;
  const loading = ++review.loading;
  try {
    const status = await pollDocument(id, (s) => review.id === id && showDocumentStatus(s));
    if (review.id !== id || loading !== review.loading) return;
    const answer = await call("GET", `documents/${encodeURIComponent(id)}/transcript?format=json`);
    const markdown = await call("GET", `documents/${encodeURIComponent(id)}/transcript`);
    if (review.id !== id || loading !== review.loading) return;
    review.pages = answer.json().pages;
    prepareDownloads(status.filename, markdown.text, answer.text);
    drawStrip();
    showPage(review.current);
  } catch (failure) {
    if (review.id === id) notice(failure.message, "error");
  }
}

function showDocumentStatus(status) {
  review.status = status;
  $("doc-title").textContent = status.filename;
  setStatus($("doc-status"), status.status);
  const pages = status.pages || {};
  $("doc-summary").textContent =
    `${status.page_count} pages · ${pages.COMPLETED || 0} done · ${(pages.FAILED || 0) + (pages.SKIPPED || 0)} failed` +
    ` · ${status.flagged_pages} flagged · ${usd(status.cost)} · ${status.prompt_tokens + status.completion_tokens}` +
    ` tokens · ${status.model}`;
}

function prepareDownloads(filename, markdown, json) {
  for (const url of review.blobs) URL.revokeObjectURL(url);
  const stem = (filename || review.id).replace(/\.[^.]+$/, "");
  const links = [
    ["download-md", markdown, "text/markdown", `${stem}.md`],
    ["download-json", json, "application/json", `${stem}.json`],
  ];
  review.blobs = links.map(([id, body, type, name]) => {
    const url = URL.createObjectURL(new Blob([body], { type }));
    const link = $(id);
    link.href = url;
    link.download = name;
    link.hidden = false;
    return url;
  });
}

function drawStrip() {
  const strip = $("page-strip");
  strip.replaceChildren();
  for (const page of review.pages) {
    const button = element("button", page.page, "page-button");
    button.type = "button";
    button.dataset.page = String(page.page);
    if (doubtful(page)) button.classList.add("doubtful");
    if (page.status !== "COMPLETED") button.classList.add("failed");
    if (page.corrected) button.classList.add("corrected");
    button.title = `Page ${page.page}: ${page.status}${page.flags.length ? `, ${page.flags.length} flag(s)` : ""}`;
    button.addEventListener("click", () => goTo(page.page));
    strip.append(button);
  }
}

function goTo(pageNumber) {
  location.hash = `#doc/${encodeURIComponent(review.id)}/${pageNumber}`;
}

function showPage(pageNumber) {
  const page = review.pages.find((p) => p.page === pageNumber) || review.pages[0];
  if (!page) return;
  review.current = page.page;
  for (const button of $("page-strip").children) {
    button.toggleAttribute("aria-current", Number(button.dataset.page) === page.page);
  }
  show("page-view", true);
  const view = $("page-view");
  view.dataset.page = String(page.page);
  view.classList.toggle("doubtful", doubtful(page));
  $("page-title").textContent = `Page ${page.page} of ${review.pages.length} · ${page.status}`;
  drawFlags(page);
  $("page-error").textContent = page.error || "";
  show("page-error", Boolean(page.error));
  drawFacts(page);
  drawText(page);
  closeEditor();
  loadImage(page.page);
}

function drawFlags(page) {
  const list = $("page-flags");
  list.replaceChildren();
  for (const flag of page.flags || []) {
    const item = element("li", undefined, `flag flag-${flag.flag}`);
    item.dataset.flag = flag.flag;
    item.append(
      element("span", flag.flag.replaceAll("_", " "), "flag-name"),
      element("mark", number(flag.value), "flag-value"),
      element("span", `threshold ${number(flag.threshold)}`, "flag-threshold"),
    );
    list.append(item);
  }
}

function drawFacts(page) {
  const facts = [
    ["Model", page.model ? `${page.model}${page.escalated ? " (escalated)" : ""}` : "—"],
    ["Provider", page.provider || "—"],
    ["Tokens", `${page.prompt_tokens} in · ${page.completion_tokens} out`],
    ["Cost", usd(page.cost)],
    ["Calls", (page.attempts || []).length],
  ];
  if (page.corrected && page.correction) {
    facts.push(["Corrected", `revision ${page.correction.revision}, ${when(page.correction.corrected_at)}`]);
  }
  const list = $("page-facts");
  list.replaceChildren();
  for (const [term, value] of facts) list.append(element("dt", term), element("dd", value));
}

function drawText(page) {
  const text = page.text || "";
  $("rendered").replaceChildren(DOMPurify.sanitize(marked.parse(text), SANITIZE));
  $("raw").textContent = text;
  show("rendered", !review.raw);
  show("raw", review.raw);
  $("toggle-raw").setAttribute("aria-pressed", String(review.raw));
  $("toggle-raw").textContent = review.raw ? "Rendered" : "Raw";
}

async function loadImage(pageNumber) {
  const img = $("page-img");
  const note = $("image-note");
  img.hidden = true;
  img.removeAttribute("src");
  note.textContent = "loading the page image…";
  try {
    const path = `documents/${encodeURIComponent(review.id)}/pages/${pageNumber}/image`;
    const link = (await call("GET", path)).json();
    if (review.current !== pageNumber) return;
    img.src = link.url;
    img.hidden = false;
    note.textContent = `Page ${pageNumber}, as sent to the model`;
  } catch (failure) {
    if (review.current === pageNumber) note.textContent = `No image: ${failure.message}`;
  }
}

function toggleRaw() {
  review.raw = !review.raw;
  const page = review.pages.find((p) => p.page === review.current);
  if (page) drawText(page);
}

function moveTo(step, onlyDoubtful) {
  const candidates = review.pages.filter((p) => !onlyDoubtful || doubtful(p)).map((p) => p.page);
  const next =
    step > 0 ? candidates.find((n) => n > review.current) : [...candidates].reverse().find((n) => n < review.current);
  if (next !== undefined) goTo(next);
  else if (onlyDoubtful) notice(candidates.length ? "No more flagged pages that way." : "No flagged pages.", "");
}

$("toggle-raw").addEventListener("click", toggleRaw);

// --- re-run and correct ---------------------------------------------------------------------------------------------

$("rerun").addEventListener("click", async () => {
  const pageNumber = review.current;
  const model = $("rerun-model").value.trim();
  $("rerun").disabled = true;
  try {
    const path = `documents/${encodeURIComponent(review.id)}/pages/${pageNumber}/rerun`;
    const queued = (await call("POST", path, model ? { model } : {})).json();
    notice(`Page ${pageNumber} queued again on ${queued.model}…`, "busy");
    await loadDocument();
    const page = review.pages.find((p) => p.page === pageNumber);
    if (page) notice(`Page ${pageNumber} re-run on ${queued.model}: ${page.status}.`, "done");
  } catch (failure) {
    notice(`Re-run refused: ${failure.message}`, "error");
  } finally {
    $("rerun").disabled = false;
  }
});

function openEditor() {
  const page = review.pages.find((p) => p.page === review.current);
  if (!page) return;
  $("editor-text").value = page.text || "";
  show("editor", true);
  show("rendered", false);
  show("raw", false);
  $("editor-text").focus();
}

function closeEditor() {
  show("editor", false);
  show("rendered", !review.raw);
  show("raw", review.raw);
}

$("edit").addEventListener("click", openEditor);
$("cancel-edit").addEventListener("click", closeEditor);
$("editor").addEventListener("submit", async (event) => {
  event.preventDefault();
  const pageNumber = review.current;
  $("save").disabled = true;
  try {
    const path = `documents/${encodeURIComponent(review.id)}/pages/${pageNumber}/correction`;
    const saved = (await call("PUT", path, { markdown: $("editor-text").value })).json();
    await loadDocument();
    notice(`Correction of page ${pageNumber} saved (revision ${saved.revision}).`, "done");
  } catch (failure) {
    notice(`The correction was not saved: ${failure.message}`, "error");
  } finally {
    $("save").disabled = false;
  }
});

// --- keyboard -------------------------------------------------------------------------------------------------------

const KEYS = {
  j: () => moveTo(1, true),
  k: () => moveTo(-1, true),
  n: () => moveTo(1, false),
  p: () => moveTo(-1, false),
  r: toggleRaw,
  e: openEditor,
};

document.addEventListener("keydown", (event) => {
  if ($("document").hidden || !review.pages.length) return;
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.target.closest("input, textarea, select, [contenteditable]")) return;
  const action = KEYS[event.key];
  if (action) {
    event.preventDefault();
    action();
  }
});

// --- routing --------------------------------------------------------------------------------------------------------

function route() {
  if (!sessionStorage.getItem(KEY_STORAGE)) {
    showLogin("");
    return;
  }
  show("login", false);
  show("session", true);
  const key = sessionStorage.getItem(KEY_STORAGE);
  $("key-label").textContent = `key …${key.slice(-4)}`;
  const match = /^#doc\/([^/]+)(?:\/(\d+))?$/.exec(location.hash);
  show("home", !match);
  show("document", Boolean(match));
  if (match) {
    openDocument(decodeURIComponent(match[1]), match[2] ? Number(match[2]) : undefined);
  } else {
    review.id = null;
    review.pages = [];
    loadDocuments();
  }
}

window.addEventListener("hashchange", route);
route();
