// progrouter dashboard: reads /dashboard/stream (Server-Sent Events, read with fetch so that the
// Authorization header an authenticating proxy adds applies as to the page itself) and keeps the DOM bounded: one card per Rank, one page of table rows, the last MAX_EVENTS events.
"use strict";
const MAX_EVENTS = 200;
const $ = (id) => document.getElementById(id);
const view = { page: 0, size: 50, state: "" };
const stats = { pushes: 0, lastLatencyMs: null, pages: 1 };
window.dashboardStats = stats;
let controller = null;

function num(v, digits = 0) {
  return v === null || v === undefined ? "–" : Number(v).toLocaleString(undefined, {
    maximumFractionDigits: digits, minimumFractionDigits: digits });
}
function secs(v) { return v === null || v === undefined ? "–" : num(v, 1) + " s"; }
function pct(v) { return v === null || v === undefined ? "–" : num(100 * v, 1) + " %"; }
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function rankCard(r) {
  let card = document.querySelector(`.rank[data-target="${CSS.escape(r.target_id)}"]`);
  if (!card) {
    card = el("div", undefined, "rank");
    card.dataset.target = r.target_id;
    $("ranks").append(card);
  }
  const cap = r.capacity_tokens || 1;
  const fresh = r.observation_fresh;
  const rows = [
    ["KV used / capacity", `${num(r.used_tokens)} / ${num(r.capacity_tokens)}`],
    ["ledger charge", num(r.ledger_tokens)],
    ["vLLM KV usage", pct(r.vllm_kv_cache_usage)],
    ["running / retained / pooled", `${r.running} / ${r.retained} / ${r.pooled_programs}`],
    ["pooled requests", num(r.pooled_requests)],
    ["queue wait (mean)", secs(r.queue_wait_seconds)],
    ["token cache hit", pct(r.cache_hit_ratio)],
    ["observation age", secs(r.observation_age_seconds) + (fresh ? "" : " (stale)")],
    ["accounting", r.accounting_source],
  ];
  const bar = el("div", undefined, "bar");
  const used = el("div", undefined, "used");
  used.style.width = Math.min(100, 100 * r.used_tokens / cap) + "%";
  const ledger = el("div", undefined, "ledger");
  ledger.style.left = Math.min(100, 100 * r.ledger_tokens / cap) + "%";
  bar.append(used, ledger);
  const dl = el("dl");
  for (const [k, v] of rows) {
    const dd = el("dd", v, k === "observation age" && !fresh ? "stale" : "");
    dl.append(el("dt", k), dd);
  }
  card.replaceChildren(el("h3", `${r.target_id}`), bar, dl);
}

function renderRanks(ranks) {
  const keep = new Set(ranks.map((r) => r.target_id));
  for (const card of document.querySelectorAll(".rank")) if (!keep.has(card.dataset.target)) card.remove();
  ranks.forEach(rankCard);
}

function renderPage(page) {
  stats.pages = page.pages;
  $("pageinfo").textContent = `page ${page.index + 1} / ${page.pages} (${num(page.total)})`;
  const rows = page.rows.map((p) => {
    const tr = el("tr", undefined, p.state);
    tr.dataset.program = p.program;
    tr.append(el("td", p.program), el("td", p.state), el("td", p.rank ?? "–"),
      el("td", num(p.context_tokens), "num"), el("td", secs(p.ttl_left_seconds), "num"),
      el("td", num(p.pooled_requests), "num"), el("td", secs(p.age_seconds), "num"));
    return tr;
  });
  $("rows").replaceChildren(...rows);
}

function renderEvents(events) {
  const list = $("events");
  for (const e of events) {
    const t = new Date(e.time * 1000).toISOString().slice(11, 23);
    const fields = Object.entries(e).filter(([k]) => !["seq", "time", "event"].includes(k))
      .map(([k, v]) => `${k}=${v}`).join(" ");
    const li = el("li", `${t} ${e.event} ${fields}`);
    li.dataset.event = e.event;
    list.prepend(li);
  }
  while (list.childElementCount > MAX_EVENTS) list.lastElementChild.remove();
}

function render(data) {
  stats.pushes += 1;
  stats.lastLatencyMs = Date.now() - data.time * 1000;
  if (!data.enabled) {
    $("totals").textContent = "Program scheduling is not enabled";
    return;
  }
  const c = data.counts;
  $("totals").textContent = `${num(data.programs)} Programs: ${num(c.running)} running, ` +
    `${num(c.retained)} retained, ${num(c.pooled)} pooled · ${num(data.retained_requests)} requests in the pool`;
  renderRanks(data.ranks);
  renderPage(data.page);
  renderEvents(data.events);
  $("status").textContent = "live";
}

async function connect() {
  if (controller) controller.abort();
  controller = new AbortController();
  const query = new URLSearchParams({ page: view.page, size: view.size });
  if (view.state) query.set("state", view.state);
  try {
    const response = await fetch("dashboard/stream?" + query, { signal: controller.signal });
    if (response.status === 401 || response.status === 403) {
      $("status").textContent = "the stream needs the admin API key";
      return;
    }
    if (!response.ok) throw new Error("HTTP " + response.status);
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
        if (chunk.startsWith("data: ")) render(JSON.parse(chunk.slice(6)));
      }
    }
  } catch (error) {
    if (error.name === "AbortError") return;
    $("status").textContent = "disconnected: " + error.message;
  }
  setTimeout(connect, 2000);
}

function go(page) {
  view.page = Math.max(0, Math.min(page, stats.pages - 1));
  connect();
}
$("prev").onclick = () => go(view.page - 1);
$("next").onclick = () => go(view.page + 1);
$("state").onchange = (e) => { view.state = e.target.value; go(0); };
connect();
