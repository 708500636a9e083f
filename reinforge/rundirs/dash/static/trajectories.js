"use strict";
// The trajectory viewer: one step's rollouts (an eval's all), filtered, and one of them
// token by token, the sampled tokens coloured by log-prob, advantage or policy version.

// Log-probs at or below this get the reddest colour.
const LOGPROB_FLOOR = -6;

const $ = (id) => document.getElementById(id);
const params = query();
const run = params.get("run");
let step = params.has("step") ? Number(params.get("step")) : null;
let line = params.has("line") ? Number(params.get("line")) : null;
let knownSteps = [];
let isEval = false;
let rows = [];
let noAdvantages = null;
let largestAdvantage = 1;
let detail = null;

function saveUrl() {
  const state = new URLSearchParams({run});
  if (step !== null) state.set("step", step);
  if (line !== null) state.set("line", line);
  state.set("colour", $("colour").value);
  history.replaceState(null, "", `?${state}`);
}

function bound(id, otherwise) {
  const value = $(id).value;
  return value === "" ? otherwise : Number(value);
}

function filtered() {
  const status = $("status").value;
  const low = bound("min-reward", -Infinity);
  const high = bound("max-reward", Infinity);
  const task = $("task").value.trim();
  const unbounded = low === -Infinity && high === Infinity;
  return rows.filter((r) => (!status || r.status === status)
    && (r.reward === null ? unbounded : r.reward >= low && r.reward <= high)
    && (!task || r.task_id.includes(task)));
}

function renderRows() {
  const shown = filtered();
  const of = step === null ? "" : ` of step ${step}`;
  $("count").textContent = `${shown.length} of ${rows.length} trajectories${of}`;
  $("rows").tBodies[0].replaceChildren(...shown.map((r) => el("tr", {
    class: r.line === line ? "chosen" : null,
    "data-line": r.line,
    onclick: () => choose(r.line).catch(showError),
  },
  el("td", {}, r.line),
  el("td", {}, r.task_id),
  el("td", {}, r.index),
  el("td", {class: "number"}, num(r.reward)),
  el("td", {}, el("span", {class: `status ${r.status}`}, r.status)),
  el("td", {class: "number"}, r.sampled_tokens),
  el("td", {class: "number"}, num(r.advantage, 2)),
  )));
}

// Fills the step list; true when the first step just became the one shown.
async function loadSteps() {
  const data = await api("api/steps", {run});
  isEval = data.kind === "eval";
  $("step-control").hidden = isEval;
  $("curves").hidden = isEval;
  if (isEval || data.steps.join() === knownSteps.join()) return false;
  knownSteps = data.steps;
  $("step").replaceChildren(...knownSteps.map((s) => el("option", {value: s}, `step ${s}`)));
  const first = step === null && knownSteps.length > 0;
  if (first) step = knownSteps[knownSteps.length - 1];
  if (step !== null) $("step").value = String(step);
  return first;
}

async function loadRows() {
  if (!isEval && step === null) return renderRows();
  const data = await api("api/trajectories", {run, step: isEval ? null : step});
  rows = data.rows;
  noAdvantages = data.no_advantages;
  largestAdvantage = Math.max(1e-9, ...rows.map((r) => Math.abs(r.advantage ?? 0)));
  renderRows();
}

async function choose(at) {
  line = at;
  saveUrl();
  renderRows();
  detail = await api("api/trajectory", {run, step: isEval ? null : step, line});
  renderDetail();
}

function colour(mode, logprob, version, advantage) {
  if (mode === "logprob") {
    const t = Math.min(1, Math.max(0, logprob / LOGPROB_FLOOR));
    return `hsl(${Math.round(120 * (1 - t))}, 70%, 80%)`;
  }
  if (mode === "version") return `hsl(${(version * 67) % 360}, 65%, 80%)`;
  if (advantage === null) return "#e0e0e0";
  const t = Math.max(-1, Math.min(1, advantage / largestAdvantage));
  return `hsl(${t >= 0 ? 210 : 0}, 80%, ${Math.round(95 - 35 * Math.abs(t))}%)`;
}

function swatch(background, text) {
  return el("span", {class: "tok trained", style: `background:${background}`}, text);
}

function legend(d, mode) {
  const scale = {
    logprob: [0, -1, -2, -3, -4, -5, -6].map((lp) => swatch(colour(mode, lp), ` ${lp} `)),
    version: [...new Set(d.policy_versions)].map((v) => swatch(colour(mode, 0, v), ` v${v} `)),
    advantage: [-1, -0.5, 0, 0.5, 1].map((f) =>
      swatch(colour(mode, 0, 0, f * largestAdvantage), ` ${(f * largestAdvantage).toFixed(2)} `)),
  }[mode];
  return el("p", {class: "legend"},
    "Sampled tokens (loss mask 1: what training learns from) are coloured and underlined: ", ...scale,
    ". Grey: prompt, template, tool and environment tokens (not trained). Hover a token.");
}

function tokens(d, mode) {
  const box = el("div", {class: "tokens"});
  let k = 0; // logprobs and policy_versions hold one entry per sampled token
  d.token_ids.forEach((id, i) => {
    const trained = d.loss_mask[i] === 1;
    const span = el("span", {class: trained ? "tok trained" : "tok"}, d.token_texts[i]);
    if (trained) {
      const logprob = d.logprobs[k];
      const version = d.policy_versions[k];
      k += 1;
      span.style.background = colour(mode, logprob, version, d.advantage);
      span.title = `token ${i} (id ${id}), sampled: log-prob ${logprob.toFixed(3)} `
        + `(p ${Math.exp(logprob).toFixed(3)}), policy version ${version}`;
    } else {
      span.title = `token ${i} (id ${id}): prompt, template, tool or environment; not trained`;
    }
    box.append(span);
  });
  return box;
}

function messages(d) {
  return el("div", {},
    el("p", {class: "hint"}, d.token_ids.length
      ? "This run's tokenizer could not be loaded: the messages as recorded."
      : "No tokens were recorded: the messages as recorded."),
    d.messages.map((m) => el("div", {class: "message"},
      el("b", {}, m.role),
      el("pre", {}, typeof m.content === "string" ? m.content : JSON.stringify(m.content)),
      m.tool_calls ? el("pre", {}, JSON.stringify(m.tool_calls, null, 2)) : null)));
}

function renderDetail() {
  const d = detail;
  if (!d) return;
  const mode = $("colour").value;
  const sampled = d.loss_mask.filter((m) => m === 1).length;
  const versions = [...new Set(d.policy_versions)];
  const t = d.timings;
  const secs = (value) => (value ?? 0).toFixed(2);  // a part older runs did not record is 0
  const notTrained = noAdvantages
    ?? "not trained: errored, its group's rewards were all equal, or a masked truncation";
  const facts = [
    ["status", el("span", {class: `status ${d.status}`}, d.status)],
    ["reward", num(d.reward)],
    ...Object.entries(d.rewards).map(([name, value]) => [`· ${name}`, num(value)]),
    ["advantage", d.advantage === null ? notTrained : num(d.advantage)],
    ["turns", `${d.turns} (${d.tool_errors} tool errors)`],
    ["tokens", `${d.token_ids.length}, ${sampled} sampled`],
    ["policy versions", versions.length ? versions.join(", ") : "–"],
    ["seconds", `${secs(t.total_s)} (generate ${secs(t.generate_s)}, environment `
      + `${secs(t.env_s)}: start ${secs(t.start_s)}, answers ${secs(t.tools_s)}, `
      + `stop ${secs(t.stop_s)}; score ${secs(t.score_s)})`],
    ["seconds by turn", (t.turns || []).length
      ? t.turns.map((turn) => `${secs(turn.generate_s)} + ${secs(turn.env_s)}`).join(", ")
      : "–"],
  ];
  const hasTokens = d.token_texts !== null && d.token_ids.length > 0;
  $("detail").replaceChildren(el("div", {},
    el("h2", {}, `${d.task_id} · rollout ${d.index}`),
    el("table", {class: "facts"},
      facts.map(([name, value]) => el("tr", {}, el("th", {}, name), el("td", {}, value)))),
    d.error ? el("pre", {class: "error-text"}, d.error) : null,
    Object.keys(d.info).length
      ? el("details", {}, el("summary", {}, "info"), el("pre", {}, JSON.stringify(d.info, null, 2)))
      : null,
    hasTokens ? legend(d, mode) : null,
    hasTokens ? tokens(d, mode) : messages(d),
  ));
}

$("status").addEventListener("change", renderRows);
for (const id of ["min-reward", "max-reward", "task"]) {
  $(id).addEventListener("input", renderRows);
}
$("step").addEventListener("change", () => {
  step = Number($("step").value);
  line = null;
  detail = null;
  $("detail").replaceChildren(el("p", {class: "hint"}, "Pick a trajectory."));
  saveUrl();
  loadRows().catch(showError);
});
$("colour").addEventListener("change", () => {
  saveUrl();
  renderDetail();
});

async function start() {
  if (!run) throw new Error("no run named: open this page from the runs list");
  if (params.has("colour")) $("colour").value = params.get("colour");
  $("title").textContent = run;
  $("curves").href = `run.html?run=${encodeURIComponent(run)}`;
  await loadSteps();
  await loadRows();
  if (line !== null) await choose(line);
  // New steps of a live run join the list; the step shown stays until another is picked.
  poll(async () => {
    if (await loadSteps()) await loadRows();
  });
}

start().catch(showError);
