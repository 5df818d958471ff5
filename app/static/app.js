// The try-it page: pick an image, classify it (or, with a detection model, detect objects and draw their boxes on
// it) with the native API, compare backends side by side.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { file: null, models: [] };
// A request's stages in the order it goes through them: the keys of the classify response's
// timing_ms (app/api/schemas.py Timing), drawn as one stacked bar per response.
const STAGES = ["decode", "preprocess", "queue", "inference", "postprocess"];
// Detection boxes on the image: the width the picture is drawn at, and the box colour (Okabe-Ito vermillion).
const DRAWN_WIDTH = 480;
const BOX_COLOUR = "#D55E00";

function show(message, isError = false) {
  $("message").textContent = message;
  $("message").className = isError ? "error" : "";
}

async function getJson(url) {
  const response = await fetch(url);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `${url}: HTTP ${response.status}`);
  return body;
}

function describeModel(model) {
  // where the model came from, as /v1/models says: built here (recipe, quantize) or imported as a file
  if (!model) return "";
  const origin = model.provenance.origin === "imported"
    ? `imported from ${model.provenance.files.map((f) => f.name).join(" + ")}`
    : "built here";
  const problem = model.error ? ` · ${model.state}: ${model.error}` : "";
  return `${model.description} · ${origin} · source: ${model.source} · licence: ${model.licence}${problem}`;
}

function selectedModel() {
  return state.models.find((m) => m.name === $("model").value);
}

function isDetector(model) {
  return model !== undefined && model.task === "detection";
}

function fillBackends() {
  const model = selectedModel();
  $("about").textContent = describeModel(model);
  const detector = isDetector(model);  // what the buttons do, and which threshold they take
  $("classify").textContent = detector ? "Detect" : "Classify";
  $("topk-label").hidden = detector;
  $("minscore-label").hidden = !detector;
  const backends = model ? Object.keys(model.backends) : [];
  $("backend").replaceChildren(...backends.map((b) => new Option(b, b)));
  $("compare").title = `Run the same image on: ${backends.join(", ") || "no backend loaded"}`;
  updateButtons();
}

function updateButtons() {
  const ready = state.file !== null && $("backend").options.length > 0;
  $("classify").disabled = !ready;
  $("compare").disabled = !ready || $("backend").options.length < 2;
}

async function loadModels() {
  const body = await getJson("/v1/models");
  state.models = body.models;
  $("model").replaceChildren(...body.models.map((m) => new Option(`${m.name} (${m.state})`, m.name)));
  // the classifier /v1/classify uses, else the detector /v1/detect uses, else the first model listed
  const first = body.models.length ? body.models[0].name : "";
  $("model").value = body.default_model || body.default_detection_model || first;
  fillBackends();
  if (state.models.length && $("backend").options.length) {
    $("backend").value = Object.keys(selectedModel().backends)
      .includes(body.default_backend) ? body.default_backend : $("backend").value;
  }
}

async function loadDevices() {
  try {
    const body = (await getJson("/v1/devices")).backends.edgetpu ||
      { devices: [], error: "the Edge TPU backend is not installed here" };
    const healthy = body.devices.filter((d) => d.health === "healthy").length;
    const text = body.devices.length
      ? `Edge TPUs: ${body.devices.length} (${healthy} healthy)` +
        body.devices.map((d) => ` · ${d.type} ${d.path}: ${d.health}`).join("")
      : `Edge TPUs: none${body.error ? ` (${body.error.split(/[(:]/)[0].trim()}; details on hover)` : ""}`;
    $("devices").textContent = text;
    $("devices").title = body.error || "";
    $("devices").className = "status" + (body.devices.some((d) => d.health !== "healthy" && d.health !== "unused") ? " bad" : "");
  } catch (e) {
    $("devices").textContent = `devices: ${e.message}`;
    $("devices").className = "status bad";
  }
}

function pickFile(file) {
  if (!file) return;
  state.file = file;
  const preview = $("preview");
  preview.src = URL.createObjectURL(file);
  preview.hidden = false;
  $("drop-text").hidden = true;
  show(`${file.name}: ${Math.round(file.size / 1024)} KiB`);
  updateButtons();
}

async function classifyOn(model, backend, topK) {
  return post(`/v1/models/${encodeURIComponent(model)}/classify?backend=${encodeURIComponent(backend)}&top_k=${topK}`);
}

async function detectOn(model, backend, minScore) {
  return post(`/v1/models/${encodeURIComponent(model)}/detect?backend=${encodeURIComponent(backend)}` +
    `&min_score=${minScore}`);
}

async function post(url) {
  const response = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": state.file.type || "application/octet-stream" },
    body: state.file,
  });
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function loadImage(file) {
  return new Promise((resolve, reject) => {
    const image = new Image();
    image.onload = () => resolve(image);
    image.onerror = () => reject(new Error("the browser cannot show this image"));
    image.src = URL.createObjectURL(file);
  });
}

function boxesCanvas(result, image) {
  // The picture as a viewer shows it (browsers apply EXIF orientation, as the service does), the boxes on it.
  const scale = Math.min(1, DRAWN_WIDTH / result.image.width);
  const canvas = document.createElement("canvas");
  canvas.className = "boxes";
  canvas.width = Math.round(result.image.width * scale);
  canvas.height = Math.round(result.image.height * scale);
  const ctx = canvas.getContext("2d");
  ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
  ctx.lineWidth = 2;
  ctx.font = "13px system-ui, sans-serif";
  ctx.textBaseline = "top";
  const drawn = [];
  for (const d of result.detections) {
    // on whole canvas pixels: a 2 px line centred there covers two pixels fully (crisp, no blending)
    const x = Math.round(d.box.x_min * scale), y = Math.round(d.box.y_min * scale);
    const w = Math.round(d.box.x_max * scale) - x, h = Math.round(d.box.y_max * scale) - y;
    ctx.strokeStyle = BOX_COLOUR;
    ctx.strokeRect(x, y, w, h);
    const text = `${d.label} ${(d.score * 100).toFixed(0)}%`;
    const textWidth = ctx.measureText(text).width + 6;
    const top = y >= 17 ? y - 17 : y;  // above the box, or inside it at the image's top edge
    ctx.fillStyle = BOX_COLOUR;
    ctx.fillRect(x, top, textWidth, 17);
    ctx.fillStyle = "#fff";
    ctx.fillText(text, x + 3, top + 2);
    drawn.push({ label: d.label, x, y, w, h });
  }
  canvas.dataset.scale = scale;
  canvas.dataset.drawn = JSON.stringify(drawn);  // what was drawn, in canvas pixels (the page's test reads it)
  return canvas;
}

function predictionRow(labelText, labelTitle, score) {
  const row = document.createElement("div");
  row.className = "pred";
  const label = document.createElement("span");
  label.className = "label";
  label.textContent = labelText;
  label.title = labelTitle;
  const value = document.createElement("span");
  value.className = "score";
  value.textContent = `${(score * 100).toFixed(1)}%`;
  const bar = document.createElement("div");
  bar.className = "bar";
  const fill = document.createElement("span");
  fill.style.width = `${Math.max(0.5, score * 100)}%`;
  bar.append(fill);
  row.append(label, value, bar);
  return row;
}

function card(result, image) {
  const el = document.createElement("div");
  el.className = "card";
  el.dataset.backend = result.backend;
  const title = document.createElement("h2");
  title.textContent = `${result.backend} `;
  const small = document.createElement("small");
  small.textContent = `${result.model}${result.cold ? " · cold" : ""} · ${result.timing_ms.total.toFixed(1)} ms`;
  title.append(small);
  el.append(title);
  if (result.detections) {
    el.append(boxesCanvas(result, image));
    const count = document.createElement("p");
    count.className = "count";
    count.textContent = `${result.detections.length} object${result.detections.length === 1 ? "" : "s"} in ` +
      `${result.image.width} × ${result.image.height} px`;
    el.append(count);
    for (const d of result.detections) {
      const box = [d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max].map((v) => v.toFixed(0)).join(", ");
      el.append(predictionRow(d.label, `class ${d.class_id} · box ${box}`, d.score));
    }
  }
  for (const p of result.predictions || []) {
    el.append(predictionRow(p.label, `class ${p.index}`, p.score));
  }
  const table = document.createElement("table");
  table.className = "timing";
  for (const [stage, ms] of Object.entries(result.timing_ms)) {
    const tr = table.insertRow();
    tr.insertCell().textContent = stage;
    tr.insertCell().textContent = `${ms.toFixed(2)} ms`;
  }
  el.append(table);
  return el;
}

function stageSum(result) {
  return STAGES.reduce((sum, stage) => sum + (result.timing_ms[stage] || 0), 0);
}

function niceCeiling(value) {
  // the smallest 1, 2, 2.5 or 5 x 10^k at or above value: a scale whose ticks read easily
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 2.5, 5, 10].map((m) => m * power).find((v) => v >= value * (1 - 1e-9));
}

function formatMs(ms) {
  return ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2);
}

function stageChart(results) {
  // One horizontal stacked bar per response, every bar on the same ms scale: widths compare across backends.
  const scale = niceCeiling(Math.max(...results.map(stageSum)));
  const mantissa = scale / 10 ** Math.floor(Math.log10(scale));
  const ticks = Math.abs(mantissa - 2) < 1e-9 ? 4 : 5;  // steps of 1, 2, 5 or 0.5 x 10^k
  const el = document.createElement("div");
  el.id = "stages";
  el.dataset.scale = scale;
  el.style.setProperty("--ticks", ticks);
  const title = document.createElement("h2");
  title.textContent = results.length > 1 ? "Where the time went, backend by backend " : "Where the time went ";
  const small = document.createElement("small");
  small.textContent = "server-side stages of each request, ms, one scale";
  title.append(small);
  const legend = document.createElement("ul");
  legend.className = "legend";
  for (const stage of STAGES) {
    const item = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = `swatch stage-${stage}`;
    item.append(swatch, stage);
    legend.append(item);
  }
  el.append(title, legend);
  for (const result of results) {
    const row = document.createElement("div");
    row.className = "stage-row";
    row.dataset.backend = result.backend;
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = result.backend;
    const track = document.createElement("div");
    track.className = "track";
    for (const stage of STAGES) {
      const ms = result.timing_ms[stage] || 0;
      const seg = document.createElement("span");
      seg.className = `seg stage-${stage}`;
      seg.dataset.stage = stage;
      seg.dataset.ms = ms;
      seg.style.width = `${(ms / scale) * 100}%`;
      seg.title = `${result.backend}, ${stage}: ${ms.toFixed(2)} ms`;
      seg.textContent = formatMs(ms);
      track.append(seg);
    }
    const sum = document.createElement("span");
    sum.className = "sum";
    sum.textContent = `${formatMs(stageSum(result))} ms`;
    sum.title = `response total (timing_ms.total): ${result.timing_ms.total.toFixed(2)} ms`;
    row.append(name, track, sum);
    el.append(row);
  }
  const axis = document.createElement("div");
  axis.className = "stage-row axis";
  const scaleEl = document.createElement("div");
  scaleEl.className = "scale";
  for (let i = 0; i <= ticks; i++) {
    const tick = document.createElement("span");
    tick.style.left = `${(i / ticks) * 100}%`;
    tick.textContent = `${+(scale * i / ticks).toPrecision(3)}${i === ticks ? " ms" : ""}`;
    scaleEl.append(tick);
  }
  axis.append(document.createElement("span"), scaleEl, document.createElement("span"));
  el.append(axis);
  return el;
}

function fitStageLabels() {
  // a segment too narrow for its figure shows none (the figure stays in its tooltip)
  for (const seg of document.querySelectorAll("#stages .seg")) {
    seg.classList.remove("narrow");
    if (seg.scrollWidth > seg.clientWidth) seg.classList.add("narrow");
  }
}

function errorCard(backend, message) {
  const el = document.createElement("div");
  el.className = "card error-card";
  el.dataset.backend = backend;
  el.textContent = `${backend}: ${message}`;
  return el;
}

async function run(backends) {
  const model = $("model").value;
  const detector = isDetector(selectedModel());
  const topK = Math.min(20, Math.max(1, parseInt($("topk").value, 10) || 5));
  const minScore = Math.min(1, Math.max(0, parseFloat($("minscore").value) || 0));
  $("classify").disabled = $("compare").disabled = true;
  show(`${detector ? "detecting" : "classifying"} on ${backends.join(", ")} …`);
  const cards = [];
  const answered = [];
  let image = null;
  if (detector) {
    try {
      image = await loadImage(state.file);
    } catch (e) {
      show(`${state.file.name}: ${e.message}`, true);
      updateButtons();
      return;
    }
  }
  for (const backend of backends) {  // one after another: each backend's timings undisturbed
    try {
      const result = detector ? await detectOn(model, backend, minScore) : await classifyOn(model, backend, topK);
      answered.push(result);
      cards.push(card(result, image));
    } catch (e) {
      cards.push(errorCard(backend, e.message));
    }
  }
  $("results").replaceChildren(...(answered.length ? [stageChart(answered)] : []), ...cards);
  fitStageLabels();
  show(`${state.file.name} on ${model}`);
  updateButtons();
}

$("file").addEventListener("change", (e) => pickFile(e.target.files[0]));
$("drop").addEventListener("dragover", (e) => { e.preventDefault(); $("drop").classList.add("over"); });
$("drop").addEventListener("dragleave", () => $("drop").classList.remove("over"));
$("drop").addEventListener("drop", (e) => {
  e.preventDefault();
  $("drop").classList.remove("over");
  pickFile(e.dataTransfer.files[0]);
});
$("model").addEventListener("change", fillBackends);
window.addEventListener("resize", fitStageLabels);
$("classify").addEventListener("click", () => run([$("backend").value]));
$("compare").addEventListener("click", () => run([...$("backend").options].map((o) => o.value)));

loadModels().catch((e) => show(`cannot list models: ${e.message}`, true));
loadDevices();
