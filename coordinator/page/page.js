// The live page of a noloco-rt run: polls page/data every 2 s, draws per-stage rows, two
// curves and recent events; a stage's workers are fetched when its row is clicked (or the
// address ends in #stage=K, which a click sets: a link to it opens it). No library and no
// network beyond this coordinator: the page works offline.
"use strict";
const REFRESH_MS = 2000;
const asked = /^#stage=(\d+)$/.exec(window.location.hash);
let openStage = asked ? Number(asked[1]) : null;

function cell(text) { const td = document.createElement("td"); td.textContent = text; return td; }
function fmt(value, digits) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }
function states(counts) { return Object.entries(counts).map(([s, n]) => `${n} ${s}`).join(", "); }

function drawStages(rows) {
  const body = document.querySelector("#stages tbody");
  body.replaceChildren(...rows.map((row) => {
    const tr = document.createElement("tr");
    tr.dataset.stage = row.stage;
    if (row.stage === openStage) tr.classList.add("open");
    const kinds = row.outer_steps;
    for (const text of [row.stage, row.workers, states(row.states),
                        row.step_min === row.step_max ? row.step_max : `${row.step_min}–${row.step_max}`,
                        fmt(row.loss, 3), fmt(row.tokens_per_s, 0), row.restarts, row.checkpoint_failed,
                        [kinds.matched, kinds.partial, kinds.local, kinds.dropped_late, kinds.failed].join(" / ")]) {
      tr.appendChild(cell(text));
    }
    tr.addEventListener("click", () => { openStage = row.stage; window.location.hash = `stage=${row.stage}`; loadStage(); });
    return tr;
  }));
}

function drawCurve(name, points) {
  const svg = document.getElementById(`curve-${name}`);
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const width = 480, height = 220, left = 52, bottom = 24, top = 10, right = 10;
  const axis = document.createElementNS(ns, "path");
  axis.setAttribute("class", "axis");
  axis.setAttribute("d", `M${left},${top} V${height - bottom} H${width - right}`);
  svg.appendChild(axis);
  if (points.length === 0) return;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const span = y1 - y0 || Math.abs(y1) || 1;
  const x = (v) => left + (v - x0) / (x1 - x0) * (width - left - right);
  const y = (v) => height - bottom - (v - (y0 - 0.05 * span)) / (1.1 * span) * (height - top - bottom);
  const line = document.createElementNS(ns, "path");
  line.setAttribute("class", "line");
  line.setAttribute("d", points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
  line.dataset.points = points.length;
  svg.appendChild(line);
  const labels = [[left - 4, y(y1), y1, "end"], [left - 4, y(y0), y0, "end"],
                  [left, height - 6, x0, "start"], [width - right, height - 6, x1, "end"]];
  labels.forEach(([lx, ly, value, anchor], i) => {
    const text = document.createElementNS(ns, "text");
    text.setAttribute("x", lx); text.setAttribute("y", ly); text.setAttribute("text-anchor", anchor);
    text.textContent = i < 2 ? (Math.abs(value) < 0.01 ? value.toExponential(2) : value.toFixed(3)) : `step ${value}`;
    svg.appendChild(text);
  });
}

function drawEvents(events) {
  const list = document.getElementById("events");
  if (events.length === 0) { list.innerHTML = '<li class="none">none yet</li>'; return; }
  list.replaceChildren(...events.map((event) => {
    const li = document.createElement("li");
    li.className = event.kind;
    const when = new Date(event.time * 1000).toLocaleTimeString();
    const kind = document.createElement("span");
    kind.className = "kind"; kind.textContent = event.kind;
    li.append(`${when} `, kind, ` ${event.text}`);
    return li;
  }));
}

function drawSummary(data) {
  document.getElementById("run-id").textContent = data.run_id;
  const parts = [`${data.workers} workers in ${data.stages.length} stages`];
  if (!data.redis_available) parts.push("Redis unreachable: the last reading is shown");
  if (data.final) parts.push("the run finished: its model is written");
  if (data.note) parts.push(data.note);
  const errors = Object.entries(data.page_errors).map(([k, n]) => `${n} ${k}`).join(", ");
  if (errors) parts.push(`reading the members failed: ${errors}`);
  document.getElementById("summary").textContent = parts.join(" · ");
}

async function loadStage() {
  if (openStage === null) return;
  const response = await fetch(`page/stage?k=${openStage}`);
  if (!response.ok) return;
  const detail = await response.json();
  document.getElementById("stage-detail").hidden = false;
  document.getElementById("stage-detail-title").textContent = `Stage ${detail.stage}`;
  document.querySelector("#workers tbody").replaceChildren(...detail.workers.map((w) => {
    const tr = document.createElement("tr");
    for (const text of [w.name, w.worker, w.state, w.step, w.outer_step, fmt(w.loss, 3), fmt(w.tokens_per_s, 0),
                        w.restarts, w.checkpoint_failed, fmt(w.heartbeat_age_s, 1)]) tr.appendChild(cell(text));
    return tr;
  }));
  document.getElementById("workers-more").textContent = detail.more ? `and ${detail.more} more` : "";
}

async function refresh() {
  try {
    const response = await fetch("page/data");
    if (response.ok) {
      const data = await response.json();
      drawSummary(data);
      drawStages(data.stages);
      drawCurve("val_loss", data.curves.val_loss);
      drawCurve("spread", data.curves.spread);
      drawEvents(data.events);
      await loadStage();
      document.body.dataset.loaded = "yes";
    }
  } catch (error) {
    document.getElementById("summary").textContent = `the coordinator did not answer (${error})`;
  }
  setTimeout(refresh, REFRESH_MS);
}
refresh();
