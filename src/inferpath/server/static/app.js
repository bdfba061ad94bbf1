// The glass-box page: a chat that streams through /v1/chat/completions (sent with the
// X-Inferpath-Trace header) and, beside it, the engine's trace of that request from
// /v1/trace/{id}, polled while it runs. Plain DOM and canvas; no build step, no library.
"use strict";

const $ = (id) => document.getElementById(id);
const POLL_MS = 300;
let model = null;
let polling = null;

function headers() {
  const h = {"Content-Type": "application/json", "X-Inferpath-Trace": "1"};
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function fmtTime(s) {
  if (s === null || s === undefined) return "–";
  if (s >= 1) return s.toFixed(2) + " s";
  if (s >= 1e-3) return (s * 1e3).toFixed(2) + " ms";
  return (s * 1e6).toFixed(1) + " µs";
}

function fmtSI(x, unit) {
  if (x === null || x === undefined) return "–";
  const steps = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [v, p] of steps) if (Math.abs(x) >= v) return (x / v).toFixed(2) + " " + p + unit;
  return x.toFixed(0) + " " + unit;
}

function fmtNum(x) {
  return x === null || x === undefined ? "–" : (x >= 100 ? x.toFixed(0) : x.toPrecision(3));
}

async function init() {
  try {
    const r = await fetch("/v1/models", {headers: headers()});
    const data = await r.json();
    model = data.data[0].id;
    $("model-line").textContent = "model " + model + " (max " + data.data[0].max_model_len + " tokens)";
  } catch (e) {
    $("model-line").textContent = "could not reach /v1/models: " + e;
  }
  try {  // the presets a trace can be re-priced on (the seed's question on the seed's hardware)
    const names = (await (await fetch("/v1/trace-hardware")).json()).hardware;
    for (const name of names.slice(1)) $("hardware").add(new Option(name, name));
  } catch (e) { /* the page still works priced on this machine */ }
  $("hardware").addEventListener("change", () => {
    if (document.body.dataset.requestId) refresh(document.body.dataset.requestId);
  });
  $("ask").addEventListener("submit", (ev) => { ev.preventDefault(); ask(); });
  document.addEventListener("click", (ev) => {
    if (!ev.target.classList.contains("token")) hidePopup();
  });
}

async function ask() {
  const question = $("question").value.trim();
  if (!question) return;
  document.body.dataset.state = "streaming";
  $("send").disabled = true;
  $("answer").textContent = "";
  $("tokens").textContent = "";
  $("status").textContent = "streaming…";
  const body = {
    model, stream: true, messages: [{role: "user", content: question}],
    max_tokens: Number($("max-tokens").value), temperature: Number($("temperature").value),
  };
  let id = null, traceOff = false;
  try {
    const response = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), body: JSON.stringify(body)});
    if (!response.ok) throw new Error((await response.json()).error.message);
    // a server started with --trace off answers untraced and says so (X-Inferpath-Trace: off)
    traceOff = response.headers.get("X-Inferpath-Trace") === "off";
    if (traceOff) $("hardware-line").textContent = "no trace: " + response.headers.get("X-Inferpath-Trace-Reason");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const payload = line.slice(6);
          if (payload === "[DONE]") continue;
          const chunk = JSON.parse(payload);
          if (!id) { id = chunk.id; document.body.dataset.requestId = id; if (!traceOff) startPolling(id); }
          for (const choice of chunk.choices) {
            if (choice.delta && choice.delta.content) $("answer").textContent += choice.delta.content;
          }
        }
      }
    }
    $("status").textContent = "done";
  } catch (e) {
    $("status").textContent = "error: " + e.message;
  }
  stopPolling();
  if (id && !traceOff) await refresh(id);
  $("send").disabled = false;
  document.body.dataset.state = "done";
}

function startPolling(id) {
  stopPolling();
  polling = setInterval(() => refresh(id), POLL_MS);
}

function stopPolling() {
  if (polling) clearInterval(polling);
  polling = null;
}

async function refresh(id) {
  const on = $("hardware").value;
  const query = on === "this-machine" ? "" : "?hardware=" + encodeURIComponent(on);
  const r = await fetch("/v1/trace/" + encodeURIComponent(id) + query, {headers: headers()});
  if (!r.ok) return;  // not recorded yet
  render(await r.json());
}

// a decode step that beat the probed bandwidth: the floor is wrong, and the page says so
function staleNote(stale) {
  if (!stale) return "";
  return " — PROBE STALE: a decode step read " + (stale.attained_read_bandwidth / 1e9).toFixed(1) +
    " GB/s, above the probed " + (stale.probed_read_bandwidth / 1e9).toFixed(1) +
    " GB/s (measured again when the server next starts)";
}

function render(trace) {
  const hw = trace.hardware;
  $("hardware-line").textContent = trace.dtype + " on " + hw.name + ": " + hw.source +
    "; ridge " + fmtNum(hw.ridge) + " FLOP/byte" + staleNote(trace.probe_stale);
  renderTable(trace);
  renderTokens(trace);
  renderShare(trace);
  drawSteps(trace);
  drawRoofline(trace);
  const last = trace.steps[trace.steps.length - 1];
  if (last) {
    $("batch-line").textContent = "step " + last.index + ": " + last.num_seqs + " sequence(s) in the batch (" +
      last.num_prefill_tokens + " prefill + " + last.num_decode_tokens + " decode tokens), shared with " +
      (last.num_seqs - 1) + " other(s); KV cache " + last.num_kv_blocks_used + " of " + last.num_kv_blocks_total +
      " blocks in use, this request " + last.context_len + " tokens = " + fmtSI(last.kv_bytes, "B");
  }
}

function cell(tr, text, value, cls, key) {
  const td = document.createElement("td");
  td.textContent = text;
  if (value !== undefined && value !== null) td.dataset.value = String(value);
  if (key) td.dataset.key = key;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function renderTable(trace) {
  const tbody = $("stages").querySelector("tbody");
  tbody.textContent = "";
  for (const row of trace.summary) {
    const tr = document.createElement("tr");
    tr.dataset.stage = row.stage;
    const name = cell(tr, row.stage, undefined, row.note ? "fused" : "");
    name.title = (row.covers.length ? "covers " + row.covers.join(", ") : "time outside every timed module") +
      (row.note ? "; " + row.note : "");
    for (const phase of ["prefill", "decode"]) {
      for (const key of [phase + "_measured_s", phase + "_predicted_s"]) cell(tr, fmtTime(row[key]), row[key], "", key);
      const ratio = row[phase + "_ratio"];  // measured / predicted: 1.00 is a prediction that matched
      const off = ratio === null || ratio === undefined ? "" : (Math.abs(ratio - 1) <= 0.3 ? "ratio-ok" : "ratio-off");
      cell(tr, ratio === null || ratio === undefined ? "–" : ratio.toFixed(2) + "×", ratio, off, phase + "_ratio");
      cell(tr, fmtNum(row[phase + "_intensity"]), row[phase + "_intensity"], "", phase + "_intensity");
      cell(tr, row[phase + "_bound"], undefined, "bound-" + row[phase + "_bound"]);
    }
    cell(tr, fmtSI(row.bytes_read, "B"), row.bytes_read, "", "bytes_read");
    cell(tr, fmtSI(row.flops, ""), row.flops, "", "flops");
    tbody.appendChild(tr);
  }
  $("fusions").textContent = Object.entries(trace.fusions).map(([k, v]) => k + ": " + v).join(" · ");
}

function renderTokens(trace) {
  const box = $("tokens");
  box.textContent = "";
  for (const step of trace.steps) {
    if (!step.token) continue;
    const span = document.createElement("span");
    span.className = "token" + (step.phase === "prefill" ? " prefill" : "") +
      (step.token.top[0].probability < 0.5 ? " unsure" : "");
    span.textContent = step.token.text;
    span.dataset.step = step.index;
    span.title = "step " + step.index + " (" + step.phase + ")";
    span.addEventListener("mouseenter", () => showPopup(span, step));
    span.addEventListener("click", (ev) => { ev.stopPropagation(); showPopup(span, step); });
    box.appendChild(span);
  }
}

function showPopup(span, step) {
  document.querySelectorAll(".token.selected").forEach((t) => t.classList.remove("selected"));
  span.classList.add("selected");
  const popup = $("popup");
  popup.textContent = "";
  const head = document.createElement("div");
  head.textContent = "step " + step.index + " (" + step.phase + ", batch of " + step.num_seqs + "): top 5";
  popup.appendChild(head);
  const table = document.createElement("table");
  for (const c of step.token.top) {
    const tr = document.createElement("tr");
    tr.className = "candidate" + (c.id === step.token.id ? " chosen" : "");
    tr.dataset.probability = String(c.probability);
    cell(tr, JSON.stringify(c.text));
    cell(tr, (100 * c.probability).toFixed(2) + "%");
    const bar = document.createElement("td");
    const fill = document.createElement("span");
    fill.className = "bar";
    fill.style.width = Math.max(1, Math.round(80 * c.probability)) + "px";
    bar.appendChild(fill);
    tr.appendChild(bar);
    table.appendChild(tr);
  }
  popup.appendChild(table);
  const rect = span.getBoundingClientRect();
  popup.style.left = (rect.left + window.scrollX) + "px";
  popup.style.top = (rect.bottom + window.scrollY + 4) + "px";
  popup.hidden = false;
}

function hidePopup() {
  $("popup").hidden = true;
  document.querySelectorAll(".token.selected").forEach((t) => t.classList.remove("selected"));
}

function renderShare(trace) {
  const p = trace.prefill_share;
  $("share-prefill").style.width = (100 * p) + "%";
  $("share-decode").style.width = (100 * (1 - p)) + "%";
  const decodes = trace.steps.filter((s) => s.phase === "decode").length;
  $("share-text").textContent = "prefill " + fmtTime(trace.prefill_s) + " (" + (100 * p).toFixed(1) +
    "%), decode " + fmtTime(trace.decode_s) + " over " + decodes + " steps (" + (100 * (1 - p)).toFixed(1) + "%)" +
    (trace.decode_path ? ", measured on the " + trace.decode_path + " path" : "");
}

function drawSteps(trace) {
  const canvas = $("steps-chart");
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, left = 46, right = 46, top = 12, bottom = 28;
  ctx.clearRect(0, 0, W, H);
  const steps = trace.steps;
  if (!steps.length) return;
  const maxT = Math.max(...steps.map((s) => s.step_s));
  const maxSeqs = Math.max(...steps.map((s) => s.num_seqs), 2);
  const maxKv = Math.max(...steps.map((s) => s.kv_bytes));
  const bw = (W - left - right) / steps.length;
  const y = (v, max) => H - bottom - (H - top - bottom) * v / max;
  steps.forEach((s, i) => {
    ctx.fillStyle = s.phase === "prefill" ? "#f59e0b" : "#2563eb";
    const x = left + i * bw;
    ctx.fillRect(x + bw * 0.1, y(s.step_s, maxT), Math.max(1, bw * 0.8), H - bottom - y(s.step_s, maxT));
  });
  const line = (value, max, color) => {
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    steps.forEach((s, i) => {
      const x = left + (i + 0.5) * bw;
      if (i === 0) ctx.moveTo(x, y(value(s), max)); else ctx.lineTo(x, y(value(s), max));
    });
    ctx.stroke();
  };
  line((s) => s.num_seqs, maxSeqs, "#16a34a");
  line((s) => s.kv_bytes, maxKv, "#9333ea");
  ctx.fillStyle = "#1d232b"; ctx.font = "11px sans-serif";
  ctx.fillText(fmtTime(maxT), 2, top + 8);
  ctx.fillText("0", 2, H - bottom);
  ctx.fillStyle = "#16a34a"; ctx.fillText(maxSeqs + " seqs", W - right + 4, top + 8);
  ctx.fillStyle = "#9333ea"; ctx.fillText(fmtSI(maxKv, "B"), W - right + 4, top + 22);
  ctx.fillStyle = "#1d232b";
  ctx.fillText("step time (bars: prefill orange, decode blue) · sequences in the batch (green) · KV cache of this request (purple)", left, H - 8);
}

function drawRoofline(trace) {
  const canvas = $("roofline");
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, left = 56, right = 12, top = 14, bottom = 40;
  ctx.clearRect(0, 0, W, H);
  const hw = trace.hardware;
  const points = [];
  for (const row of trace.summary) {
    for (const phase of ["prefill", "decode"]) {
      const measured = row[phase + "_measured_s"], flops = row[phase + "_flops"];
      if (flops > 0 && measured > 0 && row[phase + "_intensity"] > 0)
        points.push({x: row[phase + "_intensity"], y: flops / measured, label: row.stage, kind: phase + " stage"});
    }
  }
  for (const s of trace.steps) {
    if (s.flops > 0 && s.step_s > 0) points.push({x: s.intensity, y: s.flops / s.step_s, kind: s.phase});
  }
  const xs = points.map((p) => p.x).concat([hw.ridge]);
  const xMin = Math.pow(10, Math.floor(Math.log10(Math.min(...xs)) - 0.5));
  const xMax = Math.pow(10, Math.ceil(Math.log10(Math.max(...xs)) + 0.5));
  const ys = points.map((p) => p.y).concat([hw.peak_flops, hw.memory_bandwidth * xMin]);
  const yMin = Math.pow(10, Math.floor(Math.log10(Math.min(...ys))));
  const yMax = Math.pow(10, Math.ceil(Math.log10(hw.peak_flops * 2)));
  const px = (x) => left + (W - left - right) * (Math.log10(x) - Math.log10(xMin)) / (Math.log10(xMax) - Math.log10(xMin));
  const py = (v) => H - bottom - (H - top - bottom) * (Math.log10(v) - Math.log10(yMin)) / (Math.log10(yMax) - Math.log10(yMin));
  ctx.strokeStyle = "#e3e7ec"; ctx.lineWidth = 1; ctx.fillStyle = "#68747f"; ctx.font = "10px sans-serif";
  for (let e = Math.log10(xMin); e <= Math.log10(xMax); e++) {
    ctx.beginPath(); ctx.moveTo(px(10 ** e), top); ctx.lineTo(px(10 ** e), H - bottom); ctx.stroke();
    ctx.fillText("1e" + e, px(10 ** e) - 8, H - bottom + 12);
  }
  for (let e = Math.log10(yMin); e <= Math.log10(yMax); e++) {
    ctx.beginPath(); ctx.moveTo(left, py(10 ** e)); ctx.lineTo(W - right, py(10 ** e)); ctx.stroke();
    ctx.fillText(fmtSI(10 ** e, "F/s"), 2, py(10 ** e) + 3);
  }
  ctx.strokeStyle = "#1d232b"; ctx.lineWidth = 2; ctx.beginPath();
  ctx.moveTo(px(xMin), py(Math.max(yMin, hw.memory_bandwidth * xMin)));
  ctx.lineTo(px(hw.ridge), py(hw.peak_flops));
  ctx.lineTo(px(xMax), py(hw.peak_flops));
  ctx.stroke();
  ctx.fillStyle = "#1d232b"; ctx.font = "11px sans-serif";
  ctx.fillText("ridge " + fmtNum(hw.ridge) + " FLOP/byte", px(hw.ridge) + 4, py(hw.peak_flops) + 14);
  const colors = {"prefill stage": "#b45309", "decode stage": "#16a34a", prefill: "#f59e0b", decode: "#2563eb"};
  for (const p of points) {
    ctx.fillStyle = colors[p.kind];
    ctx.beginPath(); ctx.arc(px(p.x), py(p.y), p.label ? 4 : 3, 0, 2 * Math.PI); ctx.fill();
    if (p.label) { ctx.fillStyle = "#3e4a56"; ctx.font = "9px sans-serif"; ctx.fillText(p.label, px(p.x) + 5, py(p.y) - 3); }
  }
  ctx.fillStyle = "#1d232b"; ctx.font = "11px sans-serif";
  ctx.fillText("FLOP/byte (predicted) → measured FLOP/s; stages: brown prefill, green decode; steps: orange prefill, blue decode", left, H - 8);
}

init();
