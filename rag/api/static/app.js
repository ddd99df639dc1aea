// prefixrag web page: ask a question, stream the answer from POST /v1/ask (server-sent events over
// fetch + ReadableStream), show its sources, TTFT, cached tokens and the live prefix-cache hit rate.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "prefixrag.apiKey";
let current = null; // AbortController of the request in flight

function headers(extra = {}) {
  const key = $("api-key").value.trim();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

function fmtMs(ms) {
  if (ms == null || Number.isNaN(ms)) return "–";
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`;
}

function fmtBytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KB", "MB", "GB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log(n) / Math.log(1024)));
  return `${(n / 1024 ** i).toFixed(i ? 1 : 0)} ${units[i]}`;
}

async function errorMessage(reply) {
  try {
    const body = await reply.json();
    return body.error?.message || `${reply.status} ${reply.statusText}`;
  } catch {
    return `${reply.status} ${reply.statusText}`;
  }
}

// ---- live cache stats ---------------------------------------------------------------------------
async function refreshCache() {
  try {
    const reply = await fetch("/v1/cache", { headers: headers() });
    if (!reply.ok) {
      $("hit-rate").textContent = reply.status === 401 ? "key?" : "–";
      return;
    }
    const stats = await reply.json();
    const rate = stats.cache?.hit_rate ?? 0;
    $("hit-rate").textContent = `${(rate * 100).toFixed(1)}%`;
    $("hit-meter").style.width = `${Math.round(rate * 100)}%`;
    $("cache-size").textContent = `${fmtBytes(stats.cache?.used_bytes)} cached`;
    if (stats.model) $("model").textContent = stats.model;
  } catch {
    $("hit-rate").textContent = "offline";
  }
}

// ---- server-sent events over fetch ----------------------------------------------------------------
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of frame.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

// ---- asking -------------------------------------------------------------------------------------------
function resetResult(question) {
  $("result").hidden = false;
  $("intro").hidden = true;
  $("question-echo").textContent = question;
  $("answer").textContent = "";
  $("answer").classList.add("streaming");
  $("sources").replaceChildren();
  $("sources-title").hidden = true;
  $("error").hidden = true;
  for (const id of ["ttft", "cached", "stitched", "mode", "total", "tokens"]) $(id).textContent = "–";
  $("cached").parentElement.classList.remove("hit");
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

function renderSources(sources) {
  const list = $("sources");
  list.replaceChildren();
  for (const s of sources) {
    const li = document.createElement("li");
    const head = document.createElement("div");
    head.className = "src-head";
    const id = document.createElement("span");
    id.className = "src-id";
    id.textContent = s.collection ? `${s.collection} / ${s.doc_id}` : s.doc_id;
    const score = document.createElement("span");
    score.className = "src-score";
    score.textContent = `score ${Number(s.score).toFixed(3)}`;
    head.append(id, score);
    const text = document.createElement("div");
    text.className = "src-text";
    text.textContent = s.text;
    text.title = "click to expand";
    text.addEventListener("click", () => text.classList.toggle("open"));
    li.append(head, text);
    list.append(li);
  }
  $("sources-title").hidden = sources.length === 0;
  $("sources-title").textContent = sources.length ? `Sources (${sources.length})` : "Sources";
}

function askBody(question) {
  const body = { question, top_k: Number($("top-k").value), stream: true };
  if ($("scope").value) body.collections = [$("scope").value];
  if ($("reuse").value) body.reuse = $("reuse").value;
  return body;
}

async function ask(question) {
  if (current) current.abort();
  const controller = new AbortController();
  current = controller;
  resetResult(question);
  $("ask").disabled = true;
  const started = performance.now();
  let firstTokenAt = null;
  try {
    const reply = await fetch("/v1/ask", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
      body: JSON.stringify(askBody(question)),
      signal: controller.signal,
    });
    if (!reply.ok) {
      showError(await errorMessage(reply));
      return;
    }
    for await (const { event, data } of sseEvents(reply.body)) {
      if (event === "sources") {
        renderSources(data.sources || []);
      } else if (event === "delta") {
        if (firstTokenAt === null) {
          firstTokenAt = performance.now();
          $("ttft").textContent = fmtMs(firstTokenAt - started);
        }
        $("answer").textContent += data.text;
      } else if (event === "usage") {
        $("cached").textContent = `${data.cached_tokens} / ${data.prompt_tokens}`;
        $("cached").parentElement.classList.toggle("hit", data.cached_tokens > 0);
        $("tokens").textContent = `${data.prompt_tokens} + ${data.completion_tokens}`;
        $("stitched").textContent = `${data.stitched_tokens ?? 0} (${data.recomputed_tokens ?? 0} recomputed)`;
        $("mode").textContent = data.reuse || "prefix";
      } else if (event === "timings") {
        $("ttft").textContent = fmtMs(data.ttft_ms);
        $("ttft").title = `server-side; first token reached this page after ${fmtMs(firstTokenAt - started)}`;
        $("total").textContent = fmtMs(data.total_ms);
      } else if (event === "error") {
        showError(data.error?.message || "the answer failed");
      }
    }
    if (!$("answer").textContent) $("answer").textContent = "(empty answer)";
  } catch (err) {
    if (err.name !== "AbortError") showError(`connection failed: ${err.message}`);
  } finally {
    if (current === controller) {
      current = null;
      $("ask").disabled = false;
      $("answer").classList.remove("streaming");
    }
    refreshCache();
  }
}

// ---- collections and documents ---------------------------------------------------------------------------
function fillSelect(select, options, keep) {
  const previous = select.value;
  select.replaceChildren(...keep);
  for (const [value, label] of options) {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = label;
    select.append(option);
  }
  if ([...select.options].some((o) => o.value === previous)) select.value = previous;
}

async function refreshCollections() {
  try {
    const reply = await fetch("/v1/collections", { headers: headers() });
    if (!reply.ok) {
      $("collection-list").textContent = await errorMessage(reply);
      return;
    }
    const { data } = await reply.json();
    const label = (c) => `${c.name}${c.home ? " (yours)" : ""}${c.writable ? "" : " (read-only)"}`;
    $("collection-list").textContent = data.length
      ? data.map((c) => `${label(c)}: ${c.documents} document${c.documents === 1 ? "" : "s"}`).join(" · ")
      : "none";
    fillSelect($("scope"), data.map((c) => [c.name, c.name]), [$("scope").options[0]]);
    const writable = data.filter((c) => c.writable).sort((a, b) => b.home - a.home);
    fillSelect($("upload-target"), writable.map((c) => [c.name, c.name]), []);
  } catch (err) {
    $("collection-list").textContent = `could not list collections: ${err.message}`;
  }
}

async function refreshDocs() {
  try {
    const reply = await fetch("/v1/documents", { headers: headers() });
    if (!reply.ok) {
      $("doc-status").textContent = await errorMessage(reply);
      return;
    }
    const { data } = await reply.json();
    $("doc-count").textContent = `(${data.length})`;
    const list = $("doc-list");
    list.replaceChildren();
    for (const doc of data) {
      const li = document.createElement("li");
      const name = document.createElement("span");
      name.textContent = doc.id;
      const meta = document.createElement("span");
      meta.className = "meta";
      const n = doc.chunks ?? "?";
      meta.textContent = `${doc.collection} · ${n} chunk${n === 1 ? "" : "s"} · ${doc.chars ?? "?"} chars`;
      li.append(name, meta);
      list.append(li);
    }
  } catch (err) {
    $("doc-status").textContent = `could not list documents: ${err.message}`;
  }
}

async function upload(event) {
  event.preventDefault();
  const files = $("upload").files;
  if (!files.length) return;
  const form = new FormData();
  for (const f of files) form.append("file", f);
  $("doc-status").textContent = "uploading…";
  const target = $("upload-target").value;
  const url = target ? `/v1/documents?collection=${encodeURIComponent(target)}` : "/v1/documents";
  const reply = await fetch(url, { method: "POST", headers: headers(), body: form });
  if (reply.ok) {
    const body = await reply.json();
    $("doc-status").textContent = `added ${body.count} to ${body.collection}: ${body.ids.join(", ")}`;
    $("upload").value = "";
    refreshDocs();
    refreshCollections();
  } else {
    $("doc-status").textContent = await errorMessage(reply);
  }
}

// ---- wiring ------------------------------------------------------------------------------------------------
$("api-key").value = localStorage.getItem(KEY_STORE) || "";
$("api-key").addEventListener("change", () => {
  localStorage.setItem(KEY_STORE, $("api-key").value.trim());
  refreshCache();
  refreshCollections();
  refreshDocs();
});
$("ask-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const question = $("question").value.trim();
  if (question) ask(question);
});
$("question").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("ask-form").requestSubmit();
  }
});
$("upload-form").addEventListener("submit", upload);
$("docs-panel").addEventListener("toggle", () => {
  if ($("docs-panel").open) {
    refreshDocs();
    refreshCollections();
  }
});
refreshCache();
refreshCollections();
refreshDocs();
setInterval(refreshCache, 2500);
$("question").focus();
