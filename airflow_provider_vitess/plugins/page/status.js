// The Vitess sync status page: reads the plugin's JSON API (same origin, Airflow's session
// cookie) and renders it with plain DOM calls. Values are set as text, never parsed as HTML.
"use strict";

const WINDOWS = 20;
const SHARD_COLORS = ["#3b82c4", "#e0803b", "#4aa564", "#a05fc2", "#c94f6d", "#6b7b8c"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function number(n) {
  return n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US");
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

function time(iso) {
  return iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace(/(Z|\+00:00)$/, " UTC") : "-";
}

function stateBadge(state) {
  return el("span", { class: `state state-${state}`, "data-state": state }, state);
}

function progressCell(t) {
  if (t.rows_copied === null) return el("td", {}, el("span", { class: "muted" }, "no snapshot recorded"));
  const pct = t.percent;
  const label = pct === null
    ? `${number(t.rows_copied)} rows copied (count unknown)`
    : `${number(t.rows_copied)} of ${number(t.rows_known)} (${pct.toFixed(1)}%)`;
  const bar = el("div", { class: "bar", title: label, role: "progressbar", "aria-valuenow": pct });
  bar.append(el("div", { style: `width: ${pct === null ? 0 : pct}%` }));
  return el("td", {}, bar, " ", el("span", { class: "progress-label" }, label));
}

function tablesSection(sync) {
  const rows = sync.table_status.map((t) =>
    el("tr", { "data-table": t.table },
      el("td", { class: "table-name" }, t.table),
      el("td", { class: "key", title: t.key_reason || "" }, t.key_columns.join(", ") || "-"),
      progressCell(t),
      el("td", {}, t.phase || "-"),
      el("td", { class: "num" }, t.snapshot_seq === null ? "-" : t.snapshot_seq)));
  return el("table", { class: "tables" },
    el("thead", {}, el("tr", {}, ...["table", "unique key", "snapshot progress", "phase", "window"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows));
}

// Bars per window (oldest left): events staged, and per-shard lag behind the window's stop.
function charts(sync) {
  const windows = [...sync.windows].reverse();
  const shards = [...new Set(windows.flatMap((w) => Object.keys(w.shard_lag)))].sort();
  return el("div", { class: "charts" },
    barChart("Row events per window", windows, [{ name: "events", color: "#3b82c4", value: (w) => w.rows || 0 }]),
    barChart("Data age at commit per window (seconds)", windows,
      [{ name: "seconds behind", color: "#8a63d2", value: (w) => w.seconds_behind_at_commit || 0 }]),
    barChart("Shard lag per window (transactions behind the stop)", windows,
      shards.map((s, i) => ({ name: s, color: SHARD_COLORS[i % SHARD_COLORS.length], value: (w) => w.shard_lag[s] || 0 }))));
}

function barChart(title, windows, series) {
  const width = 420, height = 140, left = 44, bottom = 18, top = 8;
  const max = Math.max(1, ...windows.flatMap((w) => series.map((s) => s.value(w))));
  const slot = windows.length ? (width - left) / windows.length : 0;
  const bar = series.length ? Math.max(1, (slot * 0.8) / series.length) : 0;
  const chart = svg("svg", { width, height, role: "img", "aria-label": title });
  chart.append(svg("line", { x1: left, x2: width, y1: height - bottom, y2: height - bottom, stroke: "#c5cdd5" }));
  chart.append(svg("text", { x: left - 4, y: top + 8, "text-anchor": "end" }, number(max)));
  chart.append(svg("text", { x: left - 4, y: height - bottom, "text-anchor": "end" }, "0"));
  windows.forEach((w, i) => {
    series.forEach((s, j) => {
      const value = s.value(w);
      const h = ((height - bottom - top) * value) / max;
      const x = left + i * slot + slot * 0.1 + j * bar;
      const rect = svg("rect", { x, y: height - bottom - h, width: bar, height: h, fill: s.color });
      rect.append(svg("title", {}, `window ${w.seq}: ${s.name} ${number(value)}`));
      chart.append(rect);
    });
    chart.append(svg("text", { x: left + i * slot + slot / 2, y: height - 4, "text-anchor": "middle" }, w.seq));
  });
  const legend = el("div", { class: "legend" },
    ...series.map((s) => el("span", {}, el("i", { style: `background: ${s.color}` }), s.name)));
  return el("figure", {}, el("figcaption", {}, title), chart, series.length ? legend : el("p", { class: "muted" }, "no catch-up window yet"));
}

function windowsSection(sync) {
  const rows = sync.windows.map((w) =>
    el("tr", { "data-seq": w.seq },
      el("td", { class: "num" }, w.seq),
      el("td", {}, w.kind),
      el("td", {}, stateBadge(w.state)),
      el("td", {}, time(w.created_at)),
      el("td", { class: "num" }, duration(w.duration_seconds)),
      el("td", { class: "num" }, number(w.rows)),
      el("td", {}, Object.entries(w.shard_lag).map(([s, n]) => `${s}: ${number(n)}`).join(", ") || "-"),
      el("td", { class: "groups" }, (w.groups || []).map((g) => `${g.group}: ${g.shards.join(" ")} ${g.state}${g.reader ? " (reading)" : ""}`).join("; ") || "-"),
      el("td", {}, w.error || w.stopped_early || "")));
  return el("table", { class: "windows" },
    el("thead", {}, el("tr", {}, ...["window", "kind", "state", "planned", "duration", "row events", "shard lag", "shard groups", "note"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows));
}

function syncSection(sync) {
  const c = sync.committed;
  const latest = sync.latest_window;
  const facts = el("div", { class: "facts" },
    el("span", {}, "keyspace ", el("b", {}, sync.keyspace)),
    el("span", {}, "store ", el("b", {}, sync.store)),
    el("span", { class: "committed" }, "committed window ", el("b", {}, c ? c.seq : "none"),
      c ? ` (${duration(c.age_seconds)} ago)` : ""),
    c && c.as_of ? el("span", { class: "as-of", title: "every source transaction committed before this time is in every table" },
      "data as of ", el("b", {}, time(c.as_of)), ` (${duration(c.seconds_behind)} behind)`) : null,
    c && c.freshness_breached ? el("span", { class: "breach", "data-breach": "freshness" },
      `freshness objective missed: ${duration(c.seconds_behind)} behind, objective ${duration(c.freshness_sla)}`) : null,
    latest ? el("span", {}, "latest window ", el("b", {}, latest.seq), " ", stateBadge(latest.state)) : null,
    el("span", {}, sync.lock ? `running: ${sync.lock.holder}` : sync.running ? "running: shard groups reading" : "idle"));
  const positions = c ? el("p", { class: "muted positions" },
    "position: " + c.shards.map((s) => `${s.keyspace}/${s.shard} ${s.gtid}${s.copying ? " (copying)" : ""}`).join("; ")) : null;
  const error = sync.last_error
    ? el("div", {}, el("h3", {}, `Last error (window ${sync.last_error.seq}, ${time(sync.last_error.at)})`),
      el("div", { class: "error" }, sync.last_error.error))
    : null;
  return el("section", { class: "sync", "data-sync": sync.sync_id },
    el("h2", {}, sync.sync_id), facts, positions,
    el("h3", {}, "Tables"), tablesSection(sync),
    el("h3", {}, `Last ${sync.windows.length} windows`), charts(sync), windowsSection(sync),
    error);
}

async function getJson(path) {
  const response = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status} ${await response.text()}`);
  return response.json();
}

async function refresh() {
  const message = document.getElementById("message");
  try {
    const overview = await getJson("api/syncs");
    const details = await Promise.all(overview.syncs.map((s) =>
      getJson(`api/syncs/${encodeURIComponent(s.sync_id)}?store=${encodeURIComponent(s.store)}&windows=${WINDOWS}`)));
    document.getElementById("syncs").replaceChildren(...details.map(syncSection));
    document.getElementById("generated").textContent = `Generated ${time(overview.generated_at)}.`;
    const problems = Object.entries(overview.errors).map(([store, e]) => `store ${store}: ${e}`);
    message.textContent = problems.join("\n") || (details.length ? "" : "No sync has run yet.");
    message.className = problems.length ? "error" : "muted";
    if (!document.body.dataset.loaded && location.hash) {  // a task's "Vitess sync status" link
      const wanted = CSS.escape(decodeURIComponent(location.hash.slice(1)));
      document.querySelector(`section[data-sync="${wanted}"]`)?.scrollIntoView();
    }
    document.body.dataset.loaded = "true";
  } catch (exc) {
    message.textContent = `Could not load the sync status: ${exc.message}`;
    message.className = "error";
    document.body.dataset.loaded = "error";
  }
}

refresh();
setInterval(refresh, 30000);
