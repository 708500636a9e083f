"use strict";
// `reinforge diff` as a page: the behaviour of a run at one step beside another step,
// the n-grams that rose and fell most, and the same tasks before and after.

const $ = (id) => document.getElementById(id);
const run = query().get("run");

function change(row) {
  const delta = row.after - row.before;
  return `${delta >= 0 ? "+" : ""}${num(delta, row.digits)}`;
}

function rowsTable(report) {
  const counts = (row, side) => (row.counts ? ` (${row.counts[side]})` : "");
  return el("table", {id: "metrics"},
    el("thead", {}, el("tr", {}, el("th", {}, "metric"), el("th", {}, report.before),
      el("th", {}, report.after), el("th", {}, "change"))),
    el("tbody", {}, report.rows.map((row) => el("tr", {"data-metric": row.metric},
      el("td", {}, row.metric),
      el("td", {class: "number"}, num(row.before, row.digits) + counts(row, 0)),
      el("td", {class: "number"}, num(row.after, row.digits) + counts(row, 1)),
      el("td", {class: "number"}, change(row))))));
}

function ngramTable(id, title, ngrams) {
  if (!ngrams.length) return el("p", {class: "hint"}, `${title}: none`);
  return el("section", {},
    el("h3", {}, title),
    el("table", {id},
      el("thead", {}, el("tr", {}, el("th", {}, "n-gram"), el("th", {}, "before"),
        el("th", {}, "after"))),
      el("tbody", {}, ngrams.map((n) => el("tr", {},
        el("td", {}, el("code", {}, n.text)),
        el("td", {class: "number"}, num(n.before, 0)),
        el("td", {class: "number"}, num(n.after, 0)))))));
}

function example(side) {
  return el("div", {class: "example"},
    el("p", {class: "hint"}, `reward ${num(side.reward)}, ${side.status}`),
    el("pre", {}, side.text));
}

function pairList(pairs) {
  return el("section", {id: "pairs"},
    el("h3", {}, "The same tasks, before and after"),
    pairs.length ? null : el("p", {class: "hint"}, "none: no task is on both sides"),
    pairs.map((pair) => el("div", {class: "pair"},
      el("h4", {}, `${pair.task_id}: reward ${num(pair.before_reward)} → ` +
        `${num(pair.after_reward)} (mean of the task's rollouts)`),
      el("div", {class: "columns"}, example(pair.before), example(pair.after)))));
}

async function render() {
  const report = await api("api/diff",
    {run, from: $("from").value, to: $("to").value, window: $("window").value || null});
  $("report").replaceChildren(
    el("p", {class: "hint"}, report.sizes,
      `; pass rate at reward >= ${report.pass_threshold}; n-grams per 1000 rollouts`),
    rowsTable(report),
    ngramTable("rose", "Rose most", report.rose),
    ngramTable("fell", "Fell most", report.fell),
    pairList(report.pairs));
}

async function start() {
  $("title").textContent = ` / ${run} / what changed`;
  $("curves").href = `run.html?run=${encodeURIComponent(run)}`;
  const {steps} = await api("api/steps", {run});
  if (!steps.length) throw new Error(`${run} has no trajectories yet`);
  for (const id of ["from", "to"]) {
    $(id).replaceChildren(...steps.map((s) => el("option", {value: s}, s)));
  }
  $("from").value = query().get("from") || steps[0];
  $("to").value = query().get("to") || steps[steps.length - 1];
  $("window").value = query().get("window") || "";  // empty: the command's default
  for (const id of ["from", "to", "window"]) {
    $(id).addEventListener("change", () => render().then(() => showError(null), showError));
  }
  await render();
}

start().catch(showError);
