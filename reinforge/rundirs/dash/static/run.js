"use strict";
// A run's curves, one chart per metric with every ticked run overlaid, and the first run's
// time split per step. New metrics lines are fetched every POLL_MS.

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#7f7f7f", "#bcbd22"];
// Charts in this order first (a key ending in "." stands for all below it), then the rest.
const FIRST = ["reward_mean", "pass_rate", "rewards.", "completion_tokens_mean",
  "truncation_rate", "errored", "train.entropy", "train.clip_fraction", "train.kl",
  "train.mismatch_kl", "train.grad_norm", "train.loss", "train.nll", "train.lr",
  "staleness_mean", "staleness_max", "dropped_stale", "carried_over"];
// The trainer's step is waiting for groups, training and the weight sync; what total_s
// holds beyond them is recording (trajectories, checkpoints). rollout_idle_s is the rollout
// side's, overlapping the trainer's, so it is a curve of its own and not a part.
const TIME_PARTS = {trainer_idle_s: "waiting for rollouts", train_s: "training",
  sync_s: "weight sync"};
const NOT_TIME_PARTS = ["total_s", "rollout_idle_s"];
const OTHER = "other: recording, checkpoints";
const PART_COLORS = {trainer_idle_s: "#f28e2b", train_s: "#4e79a7", sync_s: "#59a14f",
  [OTHER]: "#bab0ac"};
const CHART = {width: 470, height: 230};
// What a metrics line holds beside the numbers to plot: its step, what pass_rate means, and
// the step's size.
const NOT_CURVES = ["step", "pass_threshold", "k", "tasks", "rollouts"];
const RAW = " (raw)";

const runs = new Map(); // id -> {rows, flat, next}: the metrics read so far
const charts = new Map(); // chart key -> {plot, signature}
let listed = []; // the training runs below the folder, for colours and the run list
let selected = query().getAll("run");
let smoothing = Number(document.getElementById("smoothing").value);

function flatten(row, prefix = "", out = {}) {
  for (const [key, value] of Object.entries(row)) {
    if (typeof value === "number") out[prefix + key] = value;
    else if (value && typeof value === "object" && !Array.isArray(value)) {
      flatten(value, `${prefix}${key}.`, out);
    }
  }
  return out;
}

function rank(key) {
  const at = FIRST.findIndex((k) => key === k || (k.endsWith(".") && key.startsWith(k)));
  return at < 0 ? FIRST.length : at;
}

// Exponential moving average, debiased as TensorBoard does so the first points are not
// pulled towards zero; gaps stay gaps.
function ema(values, alpha) {
  if (alpha <= 0) return values;
  let sum = 0;
  let weight = 0;
  return values.map((v) => {
    if (v === null) return null;
    sum = alpha * sum + (1 - alpha) * v;
    weight = alpha * weight + (1 - alpha);
    return sum / weight;
  });
}

function colorOf(id) {
  const at = listed.findIndex((run) => run.id === id);
  return COLORS[(at < 0 ? 0 : at) % COLORS.length];
}

// Creates the chart `key` in `parent`, or gives an existing one new data when its series
// are the same, which keeps its zoom.
function upsert(key, parent, options, data) {
  const signature = JSON.stringify(options.series.map((s) => [s.label, s.stroke]));
  let chart = charts.get(key);
  if (chart && chart.signature !== signature) {
    chart.plot.destroy();
    chart.box.remove();
    chart = null;
  }
  if (!chart) {
    const box = el("div", {class: "chart", "data-key": key});
    chart = {plot: new uPlot({...CHART, ...options}, data, box), signature, box};
    // The faint raw curves stay out of the legend: it names each run once.
    const rows = chart.plot.root.querySelectorAll(".u-series");
    options.series.forEach((s, i) => {
      if (s.label.endsWith(RAW)) rows[i].style.display = "none";
    });
    charts.set(key, chart);
  } else {
    chart.plot.setData(data);
  }
  chart.box.dataset.points = String(data[0].length);
  chart.box.dataset.series = String(data.length - 1);
  parent.append(chart.box); // appending again keeps the order of the latest render
}

function drop(key) {
  const chart = charts.get(key);
  if (!chart) return;
  chart.plot.destroy();
  chart.box.remove();
  charts.delete(key);
}

function render() {
  const shown = selected.filter((id) => runs.has(id));
  document.getElementById("title").textContent = shown.join(" · ");
  const steps = [...new Set(shown.flatMap((id) => runs.get(id).flat.map((r) => r.step)))];
  steps.sort((a, b) => a - b);
  const keys = [...new Set(shown.flatMap((id) => runs.get(id).flat.flatMap(Object.keys)))]
    .filter((key) => !NOT_CURVES.includes(key))
    .sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  const zero = keys.filter((key) =>
    shown.every((id) => runs.get(id).flat.every((r) => !r[key])));
  const plotted = keys.filter((key) => !zero.includes(key));
  const parent = document.getElementById("charts");
  for (const key of [...charts.keys()]) {
    if (key !== "time-split" && !plotted.includes(key)) drop(key);
  }
  for (const key of plotted) drawMetric(key, steps, shown, parent);
  document.getElementById("always-zero").textContent =
    zero.length ? `Always 0 so far: ${zero.join(", ")}.` : "";
  drawTimeSplit(shown[0]);
}

function drawMetric(key, steps, shown, parent) {
  const data = [steps];
  const series = [{label: "step"}];
  for (const id of shown) {
    const byStep = new Map(runs.get(id).flat.map((r) => [r.step, r[key] ?? null]));
    const raw = steps.map((step) => byStep.get(step) ?? null);
    const color = colorOf(id);
    if (smoothing > 0) {
      data.push(raw);
      series.push({label: `${id}${RAW}`, stroke: `${color}40`, width: 1, spanGaps: true});
    }
    data.push(ema(raw, smoothing));
    series.push({label: id, stroke: color, width: 2, spanGaps: true});
  }
  upsert(key, parent, {title: key, scales: {x: {time: false}}, series}, data);
}

// Stacked bars: each bar is drawn from zero to the sum of its part and the parts below it,
// tallest first, so the visible band of each is its own seconds (shown in the legend).
function drawTimeSplit(id) {
  const section = document.getElementById("time-split");
  const rows = id ? runs.get(id).rows.filter((r) => r.time) : [];
  section.hidden = rows.length === 0;
  if (!rows.length) return drop("time-split");
  const found = new Set(rows.flatMap((r) => Object.keys(r.time)));
  const parts = [
    ...Object.keys(TIME_PARTS).filter((p) => found.has(p)),
    ...[...found].filter((p) => !(p in TIME_PARTS) && !NOT_TIME_PARTS.includes(p)).sort(),
  ];
  const raw = parts.map((p) => rows.map((r) => r.time[p] ?? 0));
  if (found.has("total_s")) {
    raw.push(rows.map((r, i) => Math.max(0, r.time.total_s - parts.reduce(
      (sum, _, k) => sum + raw[k][i], 0))));
    parts.push(OTHER);
  }
  const stacked = [];
  raw.forEach((values, k) => stacked.push(values.map((v, i) => v + (k ? stacked[k - 1][i] : 0))));
  const data = [rows.map((r) => r.step)];
  const series = [{label: "step"}];
  for (let k = parts.length - 1; k >= 0; k--) {
    const color = PART_COLORS[parts[k]] ?? COLORS[k % COLORS.length];
    data.push(stacked[k]);
    series.push({
      label: parts[k] in TIME_PARTS ? `${TIME_PARTS[parts[k]]} (${parts[k]})` : parts[k],
      stroke: color,
      fill: color,
      paths: uPlot.paths.bars({size: [0.7, 40]}),
      points: {show: false},
      value: (plot, value, index, at) => (at === null ? "–" : `${raw[k][at].toFixed(2)} s`),
    });
  }
  const options = {
    title: `seconds per step, ${id}`,
    scales: {x: {time: false}, y: {range: (plot, min, max) => [0, max]}},
    series,
  };
  upsert("time-split", section, options, data);
}

function renderSidebar() {
  const list = document.getElementById("run-list");
  list.replaceChildren(...listed.map((run) => el("label", {class: "run-choice"},
    el("input", {
      type: "checkbox",
      value: run.id,
      checked: selected.includes(run.id),
      onchange: (event) => choose(run.id, event.target.checked),
    }),
    el("span", {class: "swatch", style: `background:${colorOf(run.id)}`}),
    el("span", {class: "run-name"}, run.id),
    el("span", {class: "hint", "data-steps": run.done},
      ` ${run.total ? `${run.done}/${run.total}` : run.done} steps, ${run.status}`),
  )));
  document.getElementById("trajectory-links").replaceChildren(...selected.map((id) => el("div", {},
    el("a", {href: `trajectories.html?run=${encodeURIComponent(id)}`}, id), " · ",
    el("a", {href: `diff.html?run=${encodeURIComponent(id)}`, class: "diff-link"},
      "what changed"))));
}

function choose(id, on) {
  selected = on ? [...selected, id] : selected.filter((s) => s !== id);
  const params = new URLSearchParams(selected.map((s) => ["run", s]));
  history.replaceState(null, "", `?${params}`);
  renderSidebar();
  render();
  refresh().catch(showError);
}

async function update() {
  listed = (await api("api/runs")).runs.filter((run) => run.kind === "train");
  renderSidebar();
  let changed = false;
  for (const id of selected) {
    const run = runs.get(id) ?? {rows: [], flat: [], next: 0};
    const data = await api("api/metrics", {run: id, since: run.next});
    if (data.restart) {
      run.rows = [];
      run.flat = [];
    }
    changed ||= data.rows.length > 0 || data.restart || !runs.has(id);
    run.rows.push(...data.rows);
    run.flat.push(...data.rows.map((r) => flatten(r)));
    run.next = data.next;
    runs.set(id, run);
  }
  if (changed) render();
}

// One update at a time: a tick and a click never read the same lines twice.
let pending = Promise.resolve();
function refresh() {
  pending = pending.catch(() => {}).then(update);
  return pending;
}

document.getElementById("smoothing").addEventListener("input", (event) => {
  smoothing = Number(event.target.value);
  document.getElementById("smoothing-value").textContent = smoothing.toFixed(2);
  render();
});
document.getElementById("smoothing-value").textContent = smoothing.toFixed(2);
if (selected.length) {
  api("api/config", {run: selected[0]}).then((config) => {
    document.querySelector("#config pre").textContent = JSON.stringify(config, null, 2);
  }, showError);
}
poll(refresh);
