"use strict";
// The runs list: every run and eval below the folder, refreshed while they run.

const selected = new Set();

function runLink(run) {
  const page = run.kind === "eval" ? "trajectories.html" : "run.html";
  return `${page}?run=${encodeURIComponent(run.id)}`;
}

function progress(run) {
  if (run.kind === "eval") return `${run.done} rollouts`;
  return run.total ? `${run.done}/${run.total}` : String(run.done);
}

function runRow(run) {
  const box = run.kind === "train"
    ? el("input", {
      type: "checkbox",
      checked: selected.has(run.id),
      onchange: (event) => {
        if (event.target.checked) selected.add(run.id); else selected.delete(run.id);
        updateCompare();
      },
    })
    : null;
  return el("tr", {"data-run": run.id},
    el("td", {}, box),
    el("td", {}, el("a", {href: runLink(run)}, run.id)),
    el("td", {}, run.kind),
    el("td", {}, run.model ?? "–"),
    el("td", {}, run.env ?? "–"),
    el("td", {class: "number"}, progress(run)),
    el("td", {class: "number"}, num(run.reward)),
    el("td", {class: "number"}, num(run.pass_rate)),
    el("td", {}, el("span", {class: `status ${run.status}`}, run.status)),
    el("td", {}, ago(run.updated)),
    el("td", {}, el("a", {href: `trajectories.html?run=${encodeURIComponent(run.id)}`},
      "trajectories")),
  );
}

function updateCompare() {
  const button = document.getElementById("compare");
  button.disabled = selected.size === 0;
  button.textContent = selected.size > 1 ? `Compare ${selected.size} runs` : "Open selected run";
}

document.getElementById("compare").addEventListener("click", () => {
  const params = new URLSearchParams([...selected].map((id) => ["run", id]));
  location.href = `run.html?${params}`;
});

poll(async () => {
  const data = await api("api/runs");
  document.getElementById("root").textContent = data.root;
  document.querySelector("#runs tbody").replaceChildren(...data.runs.map(runRow));
  document.getElementById("empty").hidden = data.runs.length > 0;
  updateCompare();
});
