// The try-it page: pick an image, classify it (or, with a detection model, detect objects and draw their boxes on
// it; with a segmentation model, overlay its mask with a legend; with a pose model, draw the skeleton) with the
// native API, compare backends side by side. Where the face routes serve: enroll the photo's largest face under a
// name (PUT /v1/faces/{name}), and recognize the photo's faces (DeepStack's /v1/vision/face/recognize), the names on
// their boxes.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { file: null, models: [] };
// A request's stages in the order it goes through them: the keys of the classify response's
// timing_ms (app/api/schemas.py Timing), drawn as one stacked bar per response.
const STAGES = ["decode", "preprocess", "queue", "inference", "postprocess"];
// Detection boxes on the image: the width the picture is drawn at, and the box colour (Okabe-Ito vermillion).
const DRAWN_WIDTH = 480;
const BOX_COLOUR = "#D55E00";
// A segmentation mask over the photo: how opaque its colours are, and the value of a pixel the model did not see
// (outside a center crop), left clear as the background class is (app/tasks/segment.py UNSEEN).
const MASK_ALPHA = 0.55;
const UNSEEN = 255;
// The skeleton: COCO's keypoints joined as app/tasks/pose.py SKELETON joins them, and the colours of its
// bones and joints (Okabe-Ito yellow and vermillion: colours the stage bars do not use).
const SKELETON = [[0, 1], [0, 2], [1, 3], [2, 4], [5, 6], [5, 7], [7, 9], [6, 8], [8, 10], [5, 11], [6, 12],
  [11, 12], [11, 13], [13, 15], [12, 14], [14, 16]];
const BONE_COLOUR = "#F0E442";
const JOINT_COLOUR = "#D55E00";
// What each task's button says and does: the route under /v1/models/{name}/, the threshold it takes.
const TASKS = {
  classification: { verb: "Classify", route: "classify", doing: "classifying" },
  detection: { verb: "Detect", route: "detect", doing: "detecting", threshold: "min_score" },
  segmentation: { verb: "Segment", route: "segment", doing: "segmenting" },
  pose: { verb: "Pose", route: "pose", doing: "estimating poses", threshold: "min_score" },
};

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
  // the model's one line as /v1/models tells it (`about`: what it is, where it came from, its licence), and its state
  // where it has a problem
  if (!model) return "";
  const problem = model.error ? ` · ${model.state}: ${model.error}` : "";
  return `${model.about}${problem}`;
}

function selectedModel() {
  return state.models.find((m) => m.name === $("model").value);
}

function taskOf(model) {
  return TASKS[model && model.task] || TASKS.classification;
}

function fillBackends() {
  const model = selectedModel();
  $("about").textContent = describeModel(model);
  const task = taskOf(model);  // what the buttons do, and which threshold they take
  $("classify").textContent = task.verb;
  $("topk-label").hidden = task !== TASKS.classification;
  $("minscore-label").hidden = !task.threshold;
  const backends = model ? Object.keys(model.backends) : [];
  $("backend").replaceChildren(...backends.map((b) => new Option(b, b)));
  $("compare").title = `Run the same image on: ${backends.join(", ") || "no backend loaded"}`;
  updateButtons();
}

function updateButtons() {
  const ready = state.file !== null && $("backend").options.length > 0;
  $("classify").disabled = !ready;
  $("compare").disabled = !ready || $("backend").options.length < 2;
  $("recognize").disabled = state.file === null;
  $("enroll").disabled = state.file === null || !$("person").value.trim();
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

async function segmentOn(model, backend) {
  // the answer (classes, timings), then the mask itself as the PNG of class ids at the photo's size
  const url = `/v1/models/${encodeURIComponent(model)}/segment?backend=${encodeURIComponent(backend)}`;
  const result = await post(url);
  result.mask = await loadImage(await postForBlob(`${url}&format=png`));
  return result;
}

async function poseOn(model, backend) {
  return post(`/v1/models/${encodeURIComponent(model)}/pose?backend=${encodeURIComponent(backend)}`);
}

async function send(url) {
  return fetch(url, {
    method: "POST",
    headers: { "Content-Type": state.file.type || "application/octet-stream" },
    body: state.file,
  });
}

async function post(url) {
  const response = await send(url);
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

async function postForBlob(url) {
  const response = await send(url);
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.error || `HTTP ${response.status}`);
  }
  return response.blob();
}

function vocColour(id) {
  // PASCAL VOC's colour map, as the mask PNG's palette (app/tasks/segment.py palette): class id -> [r, g, b]
  let r = 0, g = 0, b = 0;
  for (let j = 0, c = id; j < 8; j++, c >>= 3) {
    r |= ((c >> 0) & 1) << (7 - j);
    g |= ((c >> 1) & 1) << (7 - j);
    b |= ((c >> 2) & 1) << (7 - j);
  }
  return [r, g, b];
}

function photoCanvas(result, image) {
  // The picture as a viewer shows it (browsers apply EXIF orientation, as the service does), DRAWN_WIDTH at most.
  const scale = Math.min(1, DRAWN_WIDTH / result.image.width);
  const canvas = document.createElement("canvas");
  canvas.className = "boxes";
  canvas.width = Math.round(result.image.width * scale);
  canvas.height = Math.round(result.image.height * scale);
  canvas.getContext("2d").drawImage(image, 0, 0, canvas.width, canvas.height);
  canvas.dataset.scale = scale;
  return canvas;
}

function maskCanvas(result, image) {
  // The photo with the mask over it: each class in its VOC colour, the background class and unseen pixels clear.
  const canvas = photoCanvas(result, image);
  canvas.className = "boxes mask";
  const clear = new Set(result.classes.filter((c) => c.label === "background").map((c) => c.class_id));
  clear.add(UNSEEN);
  const byColour = new Map();
  for (let id = 0; id < 256; id++) byColour.set(vocColour(id).join(","), id);
  const layer = document.createElement("canvas");  // the mask at the canvas's size: nearest, as the ids are
  layer.width = canvas.width;
  layer.height = canvas.height;
  const lctx = layer.getContext("2d");
  lctx.imageSmoothingEnabled = false;
  lctx.drawImage(result.mask, 0, 0, layer.width, layer.height);
  const pixels = lctx.getImageData(0, 0, layer.width, layer.height);
  const counts = {};
  for (let i = 0; i < pixels.data.length; i += 4) {
    const id = byColour.get(`${pixels.data[i]},${pixels.data[i + 1]},${pixels.data[i + 2]}`);
    counts[id] = (counts[id] || 0) + 1;
    pixels.data[i + 3] = id === undefined || clear.has(id) ? 0 : Math.round(255 * MASK_ALPHA);
  }
  lctx.putImageData(pixels, 0, 0);
  canvas.getContext("2d").drawImage(layer, 0, 0);
  canvas.dataset.classes = JSON.stringify(counts);  // canvas pixels per class id (the page's test reads it)
  return canvas;
}

function legend(result) {
  const list = document.createElement("ul");
  list.className = "legend mask-legend";
  for (const c of result.classes) {
    const item = document.createElement("li");
    item.dataset.classId = c.class_id;
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = `rgb(${vocColour(c.class_id).join(",")})`;
    item.append(swatch, `${c.label} ${(c.fraction * 100).toFixed(1)}%`);
    list.append(item);
  }
  return list;
}

function skeletonCanvas(result, image, minScore) {
  // The photo with each pose's bones between keypoints scoring at least minScore, and its joints.
  const canvas = photoCanvas(result, image);
  const scale = parseFloat(canvas.dataset.scale);
  const ctx = canvas.getContext("2d");
  const drawn = [];
  for (const pose of result.poses) {
    const points = pose.keypoints.map((k) => ({ name: k.name, x: k.x * scale, y: k.y * scale, score: k.score }));
    ctx.strokeStyle = BONE_COLOUR;
    ctx.lineWidth = 3;
    for (const [a, b] of SKELETON) {
      if (points[a].score < minScore || points[b].score < minScore) continue;
      ctx.beginPath();
      ctx.moveTo(points[a].x, points[a].y);
      ctx.lineTo(points[b].x, points[b].y);
      ctx.stroke();
    }
    ctx.fillStyle = JOINT_COLOUR;
    for (const p of points.filter((p) => p.score >= minScore)) {
      ctx.beginPath();
      ctx.arc(p.x, p.y, 4, 0, 2 * Math.PI);
      ctx.fill();
    }
    drawn.push(points.filter((p) => p.score >= minScore));
  }
  canvas.dataset.drawn = JSON.stringify(drawn);  // the joints drawn, in canvas pixels (the page's test reads it)
  return canvas;
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
  // The picture as a viewer shows it, the boxes on it.
  const canvas = photoCanvas(result, image);
  const scale = parseFloat(canvas.dataset.scale);
  const ctx = canvas.getContext("2d");
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
    const text = d.text || `${d.label} ${(d.score * 100).toFixed(0)}%`;
    const textWidth = ctx.measureText(text).width + 6;
    const top = y >= 17 ? y - 17 : y;  // above the box, or inside it at the image's top edge
    ctx.fillStyle = BOX_COLOUR;
    ctx.fillRect(x, top, textWidth, 17);
    ctx.fillStyle = "#fff";
    ctx.fillText(text, x + 3, top + 2);
    drawn.push({ label: d.label, x, y, w, h });
  }
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
  if (result.classes) {
    el.append(maskCanvas(result, image), legend(result));
    const seen = result.seen < 1 ? ` · ${(result.seen * 100).toFixed(0)}% of it seen (center crop)` : "";
    const count = document.createElement("p");
    count.className = "count";
    count.textContent = `${result.classes.length} class${result.classes.length === 1 ? "" : "es"} in ` +
      `${result.image.width} × ${result.image.height} px${seen}`;
    el.append(count);
  }
  if (result.poses) {
    el.append(skeletonCanvas(result, image, state.minScore));
    for (const pose of result.poses) {
      el.append(predictionRow("pose", `mean of its ${pose.keypoints.length} keypoints' scores`, pose.score));
    }
  }
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
  const task = taskOf(selectedModel());
  const topK = Math.min(20, Math.max(1, parseInt($("topk").value, 10) || 5));
  const minScore = Math.min(1, Math.max(0, parseFloat($("minscore").value) || 0));
  state.minScore = minScore;
  $("classify").disabled = $("compare").disabled = true;
  show(`${task.doing} on ${backends.join(", ")} …`);
  const cards = [];
  const answered = [];
  let image = null;
  if (task !== TASKS.classification) {
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
      const result = task === TASKS.detection ? await detectOn(model, backend, minScore)
        : task === TASKS.segmentation ? await segmentOn(model, backend)
          : task === TASKS.pose ? await poseOn(model, backend) : await classifyOn(model, backend, topK);
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

async function loadFaces() {
  // the face controls, shown where the face routes serve (GET /v1/faces answers 200); else the reason on hover
  const response = await fetch("/v1/faces");
  const body = await response.json().catch(() => ({}));
  $("faces").hidden = !response.ok;
  $("faces").title = response.ok ? "" : body.error || "";
  if (response.ok) $("people").textContent = `${body.count} ${body.count === 1 ? "person" : "people"} registered`;
}

function photoForm() {
  const form = new FormData();
  form.append("image", state.file);
  return form;
}

async function enroll() {
  const name = $("person").value.trim();
  $("enroll").disabled = true;
  show(`enrolling ${name} …`);
  const response = await fetch(`/v1/faces/${encodeURIComponent(name)}?replace=false`, { method: "PUT", body: photoForm() });
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (response.ok) {
    const crowd = body.several_faces.length ? " (the photo held several faces: the largest was taken)" : "";
    show(`${body.userid}: ${body.faces} face${body.faces === 1 ? "" : "s"} registered${crowd}`);
  } else {
    show(`${name}: ${body.error || `HTTP ${response.status}`}`, true);
  }
  await loadFaces().catch(() => {});
  updateButtons();
}

async function recognize() {
  $("recognize").disabled = true;
  show("recognizing faces …");
  let image;
  try {
    image = await loadImage(state.file);
  } catch (e) {
    show(`${state.file.name}: ${e.message}`, true);
    updateButtons();
    return;
  }
  const response = await fetch("/v1/vision/face/recognize", { method: "POST", body: photoForm() });
  const body = await response.json().catch(() => ({ success: false, error: `HTTP ${response.status}` }));
  if (!response.ok || !body.success) {
    show(body.error || `HTTP ${response.status}`, true);
    updateButtons();
    return;
  }
  // the photo as the browser shows it (EXIF orientation applied, as the service applies it), a box per face
  const result = { image: { width: image.naturalWidth, height: image.naturalHeight },
    detections: body.predictions.map((p) => ({ label: p.userid, score: p.confidence,
      text: p.userid === "unknown" ? "unknown" : `${p.userid} ${(p.confidence * 100).toFixed(0)}%`,
      box: { x_min: p.x_min, y_min: p.y_min, x_max: p.x_max, y_max: p.y_max } })) };
  const el = document.createElement("div");
  el.className = "card faces-card";
  el.dataset.backend = "faces";
  const title = document.createElement("h2");
  title.textContent = "faces ";
  const small = document.createElement("small");
  small.textContent = `${body.predictions.length} found · ${body.duration.toFixed(1)} ms`;
  title.append(small);
  el.append(title, boxesCanvas(result, image));
  for (const p of body.predictions) el.append(predictionRow(p.userid, "recognition confidence", p.confidence));
  $("results").replaceChildren(el);
  show(body.message);
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
$("person").addEventListener("input", updateButtons);
$("enroll").addEventListener("click", enroll);
$("recognize").addEventListener("click", recognize);

loadModels().catch((e) => show(`cannot list models: ${e.message}`, true));
loadDevices();
loadFaces().catch(() => {});
