"use strict";
// Shared by the pages: API calls, DOM building, number formatting and polling.

// How often a page asks for new data: a training step takes seconds at the least.
const POLL_MS = 2000;

async function api(path, params = {}) {
  const url = new URL(path, location.href);
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined) url.searchParams.set(key, value);
  }
  const response = await fetch(url);
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.detail || `${path}: HTTP ${response.status}`);
  }
  return response.json();
}

// el("a", {href: "x", class: "y", onclick: f}, "text", child, [more children])
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function num(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  return Number.isInteger(value) ? String(value) : Number(value).toFixed(digits);
}

function ago(epochSeconds) {
  const s = Math.max(0, Date.now() / 1000 - epochSeconds);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

function query() {
  return new URLSearchParams(location.search);
}

function showError(error) {
  const box = document.getElementById("error");
  box.hidden = !error;
  box.textContent = error ? String(error.message || error) : "";
}

// Calls `update` now and again POLL_MS after each call ends; a failure shows in the
// page's error line and the polling goes on (a run folder may appear later).
function poll(update) {
  const tick = async () => {
    try {
      await update();
      showError(null);
    } catch (error) {
      showError(error);
    }
    setTimeout(tick, POLL_MS);
  };
  tick();
}
