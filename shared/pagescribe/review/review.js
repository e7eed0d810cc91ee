// The review page: upload documents, follow them, and check each page's transcript against its image.
//
// Transcripts are untrusted model output: they are rendered by marked, then sanitised by DOMPurify into a DOM
// fragment (a grounded page block by block, each block's unsupported words wrapped in <mark> elements made here, in
// its text nodes); the raw view and every other value is set as text. The blocks' boxes over the page image are
// elements placed by setting their style properties from this script (the policy refuses inline style markup). All URLs are relative to the page (deployed, API
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
// A transcript's ids and names would clobber the page's own elements (getElementById finds the first in the document,
// and the transcript comes first: a <div id="editor-text"> made a correction save the transcript's text); dialogs and
// popovers would open over the page. None of them survives; links and images are then made inert (see inert).
const SANITIZE = {
  RETURN_DOM_FRAGMENT: true,
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "dialog", "iframe", "object"],
  FORBID_ATTR: ["style", "id", "name", "form", "popover", "popovertarget", "popovertargetaction", "autofocus"],
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
  boxed: null, // the page whose blocks' boxes are over the image: its grounding's image size, for placing them
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
  loadImage(page.page); // hides the previous page's image at once: the new boxes wait for this page's
  loadFigures(page);
  drawBoxes(page);
  drawGrounding(page);
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

function markdown(text) {
  let fragment;
  try {
    fragment = DOMPurify.sanitize(marked.parse(text), SANITIZE);
  } catch (failure) {
    return unrendered(text, failure); // marked gives up on some inputs (2,000 nested quotes): the text still shows
  }
  return inert(fragment);
}

// Links and images in a transcript are the model's (or the document's) words, not the reviewer's to follow or load: each
// is shown as text with its target, so that a phishing link or a tracking pixel is seen for what it is.
function inert(fragment) {
  for (const link of fragment.querySelectorAll("a")) {
    const shown = element("span", link.textContent, "inert-link");
    const target = link.getAttribute("href");
    if (target) shown.append(element("span", ` <${target}>`, "target"));
    link.replaceWith(shown);
  }
  for (const image of fragment.querySelectorAll("img")) {
    const target = image.getAttribute("src") || "";
    const described = image.getAttribute("alt") ? `image: ${image.getAttribute("alt")}` : "image";
    const shown = element("span", `[${described}]`, "inert-image");
    if (target) shown.append(element("span", ` <${target.length > 80 ? `${target.slice(0, 80)}…` : target}>`, "target"));
    image.replaceWith(shown);
  }
  return fragment;
}

function unrendered(text, failure) {
  const box = element("div", undefined, "unrendered");
  box.append(
    element("p", `The markdown could not be rendered (${failure.message}); the text as it is:`, "muted"),
    element("pre", text),
  );
  return box;
}

function drawText(page) {
  const text = page.text || "";
  $("rendered").replaceChildren(...(byBlocks(page) ? blockNodes(page) : [markdown(text)]));
  $("raw").textContent = text;
  show("rendered", !review.raw);
  show("raw", review.raw);
  $("toggle-raw").setAttribute("aria-pressed", String(review.raw));
  $("toggle-raw").textContent = review.raw ? "Rendered" : "Raw";
}

// The figures kept from the page (cropped from its image, stored beside the transcript): shown under its text from the
// short-lived links the API gives, not from anything the transcript says.
async function loadFigures(page) {
  const strip = $("figures");
  strip.replaceChildren();
  show("figures", false);
  if (!page.figures || page.figures.length === 0) return;
  try {
    const path = `documents/${encodeURIComponent(review.id)}/pages/${page.page}/figures`;
    const links = (await call("GET", path)).json();
    if (review.current !== page.page) return;
    strip.append(element("p", `Figures kept from page ${page.page}`, "muted"));
    links.figures.forEach((figure, at) => {
      const img = document.createElement("img");
      img.src = figure.url;
      img.alt = `figure ${at + 1} of page ${page.page}`;
      strip.append(img);
    });
  } catch (failure) {
    if (review.current === page.page) strip.append(element("p", `Figures not loaded: ${failure.message}`, "muted"));
  }
  show("figures", review.current === page.page);
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
    img.src = link.url; // its boxes are placed once it has loaded (placeBoxes, on "load" and on each resize)
    img.hidden = false;
    note.textContent = `Page ${pageNumber}, as sent to the model`;
  } catch (failure) {
    if (review.current === pageNumber) note.textContent = `No image: ${failure.message}`;
  }
}

// --- the page's blocks, their boxes on its image, and what grounding found --------------------------------------------

const FURNITURE = new Set(["page_header", "page_footer", "page_number"]);
const FURNITURE_COMMENT = /^<!--\s*([\s\S]*?)\s*-->$/; // <!-- page number: 7 -->: shown as text, as a reader sees it
const WORD = /[\p{L}\p{N}]+/gu;
const MARKUP = /[*_`~\\\s]+/g; // what markdown wraps words in, dropped when a span's edges are matched
const SOURCES = {
  text_layer: "the text layer",
  second_read: "a second read of the image",
  engine: "the offline engine's own read",
};
const placed = new WeakMap(); // a box → its [x0, y0, x1, y1] in the pixels of the image the model was sent

function hasBox(block) {
  return Boolean(block.bbox && block.bbox.pixels);
}

// A page is drawn block by block when something of it is to be shown on the image or marked in its text; any other
// page (an older transcript, a correction: blocks, but no boxes) is rendered whole, as it always was.
function byBlocks(page) {
  const blocks = page.blocks || [];
  return blocks.some((block) => hasBox(block) || (block.unsupported || []).length > 0);
}

function blockNodes(page) {
  const text = page.text || "";
  const nodes = [];
  let at = 0;
  const between = (gap) => {
    if (gap.trim()) nodes.push(markdown(gap)); // what no block holds (a thematic break, a comment) stays as it was
  };
  for (const block of page.blocks) {
    if (block.start < at) continue;
    between(text.slice(at, block.start));
    nodes.push(blockNode(block));
    at = block.end;
  }
  between(text.slice(at));
  return nodes;
}

function blockNode(block) {
  const node = element("div", undefined, `block block-${block.type}`);
  node.dataset.blockId = block.id;
  if (block.level && block.type === "list_item") node.classList.add(`level-${Math.min(block.level, 6)}`);
  node.append(markdown(block.text));
  const comment = FURNITURE_COMMENT.exec(block.text.trim());
  if (FURNITURE.has(block.type) && !node.textContent.trim() && comment) {
    node.append(element("p", comment[1], "furniture"));
  }
  if (hasBox(block)) {
    node.classList.add("boxed");
    node.tabIndex = 0; // reachable from the keyboard: focus links it to its box as hovering does
  }
  markUnsupported(node, block.unsupported || []);
  return node;
}

// Each unsupported span is found by its words in the block's rendered text (the span is markdown: its markup is
// gone once rendered) and its stretch of text nodes wrapped in <mark> elements: text nodes are split and moved,
// never parsed.
function markUnsupported(node, spans) {
  if (!spans.length) return;
  const walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
  const texts = [];
  let whole = "";
  while (walker.nextNode()) {
    texts.push({ node: walker.currentNode, start: whole.length });
    whole += walker.currentNode.data;
  }
  const words = [...whole.matchAll(WORD)].map((m) => ({ word: m[0], start: m.index, end: m.index + m[0].length }));
  const stretches = [];
  let from = 0;
  for (const span of [...spans].sort((a, b) => a.start - b.start)) {
    const found = locate(whole, words, span.text, from);
    if (found) {
      stretches.push(found);
      from = found.next;
    }
  }
  for (const stretch of stretches.reverse()) {
    for (const text of [...texts].reverse()) wrap(text, stretch.start, stretch.end);
  }
}

function locate(whole, words, spanText, from) {
  const wanted = [...spanText.matchAll(WORD)];
  if (!wanted.length) return null;
  for (let at = from; at + wanted.length <= words.length; at++) {
    if (!wanted.every((w, i) => words[at + i].word === w[0])) continue;
    let start = words[at].start;
    let end = words[at + wanted.length - 1].end;
    const last = wanted[wanted.length - 1];
    const lead = spanText.slice(0, wanted[0].index).replace(MARKUP, "");
    const trail = spanText.slice(last.index + last[0].length).replace(MARKUP, "");
    if (lead && whole.slice(start - lead.length, start) === lead) start -= lead.length;
    if (trail && whole.startsWith(trail, end)) end += trail.length;
    return { start, end, next: at + wanted.length };
  }
  return null;
}

function wrap(text, start, end) {
  // offsets within the text node as it was first read: later stretches are wrapped first, and a split keeps the
  // node itself as the part before it, so these offsets still hold
  const from = Math.max(start, text.start) - text.start;
  const to = Math.min(end, text.start + text.node.data.length) - text.start;
  if (to <= from || !text.node.data.slice(from, to).trim()) return;
  const target = from > 0 ? text.node.splitText(from) : text.node;
  if (to - from < target.data.length) target.splitText(to - from);
  const mark = element("mark", undefined, "unsupported");
  mark.title = "not on the page";
  target.replaceWith(mark);
  mark.append(target);
}

function drawBoxes(page) {
  const layer = $("page-boxes");
  layer.replaceChildren();
  const grounding = page.grounding && page.grounding.source ? page.grounding : null;
  review.boxed = { image: (grounding && grounding.image) || null };
  for (const block of page.blocks || []) {
    if (!hasBox(block)) continue;
    const box = element("div", undefined, `box box-${block.type}`);
    box.dataset.blockId = block.id;
    box.title = `${block.type.replaceAll("_", " ")} ${block.id}`;
    placed.set(box, block.bbox.pixels);
    layer.append(box);
  }
  for (const region of (grounding && grounding.missed) || []) {
    if (!region.bbox || !region.bbox.pixels) continue;
    const box = element("div", undefined, "box missed");
    box.title = `missed: ${region.text}`;
    placed.set(box, region.bbox.pixels);
    layer.append(box);
  }
  placeBoxes();
}

// The boxes are in the pixels of the image the model was sent; the image is shown scaled to fit its column (and,
// on a desktop, the screen's height: object-fit: contain centres it in its element), so they are placed anew when
// it loads and whenever its size changes.
function placeBoxes() {
  const img = $("page-img");
  const layer = $("page-boxes");
  const ready = !img.hidden && img.complete && img.naturalWidth > 0 && layer.childElementCount > 0;
  layer.hidden = !ready;
  if (!ready) return;
  const natural = { width: img.naturalWidth, height: img.naturalHeight };
  const image = (review.boxed && review.boxed.image) || natural;
  const fit = Math.min(img.clientWidth / natural.width, img.clientHeight / natural.height);
  const shown = { width: natural.width * fit, height: natural.height * fit };
  const left = img.offsetLeft + (img.clientWidth - shown.width) / 2;
  const top = img.offsetTop + (img.clientHeight - shown.height) / 2;
  const sx = shown.width / image.width;
  const sy = shown.height / image.height;
  for (const box of layer.children) {
    const [x0, y0, x1, y1] = placed.get(box);
    box.style.left = `${left + x0 * sx}px`;
    box.style.top = `${top + y0 * sy}px`;
    box.style.width = `${Math.max(1, (x1 - x0) * sx)}px`;
    box.style.height = `${Math.max(1, (y1 - y0) * sy)}px`;
  }
}

function share(value) {
  if (value === null || value === undefined) return "?";
  const percent = value * 100;
  if (percent === 0 || percent === 100) return `${percent} %`;
  if (percent < 1) return "<1 %";
  if (percent > 99) return ">99 %";
  return `${percent < 10 ? Number(percent.toFixed(1)) : Math.round(percent)} %`;
}

function drawGrounding(page) {
  const grounding = page.grounding;
  let said = "";
  if (grounding && grounding.source) {
    said =
      `Grounded to ${SOURCES[grounding.source] || grounding.source}: ${share(grounding.grounded)} of the answer` +
      ` found on the page; ${share(grounding.ungrounded)} unsupported; ${share(grounding.missed_text)} of the` +
      ` page's text missed`;
    const missed = (grounding.missed || []).length;
    if (missed) said += ` (${missed} region${missed > 1 ? "s" : ""} outlined)`;
  } else if (grounding && grounding.skipped) {
    said = `Not grounded: ${grounding.skipped}`;
  }
  $("grounding-note").textContent = said;
  show("grounding-note", Boolean(said));
}

// Pointing at a block (the mouse, or the keyboard's focus) links it to its box, and a box to its block: both take
// the class "linked". Clicking a box brings its block into view.
function linkTo(id) {
  for (const node of document.querySelectorAll("#rendered .linked, #page-boxes .linked")) {
    node.classList.remove("linked");
  }
  if (!id) return;
  const selector = `[data-block-id="${CSS.escape(id)}"]`;
  for (const node of document.querySelectorAll(`#rendered ${selector}, #page-boxes ${selector}`)) {
    node.classList.add("linked");
  }
}

function blockAt(node) {
  const found = node instanceof Element ? node.closest("#rendered .boxed, #page-boxes [data-block-id]") : null;
  return found ? found.dataset.blockId : null;
}

for (const id of ["rendered", "page-boxes"]) {
  $(id).addEventListener("mouseover", (event) => linkTo(blockAt(event.target)));
  $(id).addEventListener("mouseout", (event) => linkTo(blockAt(event.relatedTarget)));
}
$("rendered").addEventListener("focusin", (event) => linkTo(blockAt(event.target)));
$("rendered").addEventListener("focusout", (event) => linkTo(blockAt(event.relatedTarget)));
$("page-boxes").addEventListener("click", (event) => {
  const id = blockAt(event.target);
  const block = id && $("rendered").querySelector(`[data-block-id="${CSS.escape(id)}"]`);
  if (!block || $("rendered").hidden) return;
  block.scrollIntoView({ block: "nearest" });
  block.focus({ preventScroll: true });
});
$("page-img").addEventListener("load", placeBoxes);
new ResizeObserver(placeBoxes).observe($("page-img"));

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
