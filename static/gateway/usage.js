// Usage page: prompt and completion tokens per day (uPlot, vendored in static/vendor) and the
// table per team, key and model, both from /api/v1/usage/ with the page's filters, redrawn
// every 10 s without a reload. The console stores the routers' ledgers every 5 s.
(function () {
  "use strict";
  const root = document.getElementById("usage");
  if (!root) return;
  const API = root.dataset.api;
  const FILTERS = new URLSearchParams(root.dataset.filters || "");
  const REFRESH_MS = 10000;
  const DAY_S = 86400;
  // The API's largest page; more groups than this are left to the CSV.
  const LIMIT = "1000";
  const status = document.getElementById("usage-status");
  const note = document.getElementById("usage-chart-note");
  const chartBox = document.getElementById("usage-chart");
  const tbody = document.querySelector("#usage-table tbody");
  let plot = null;

  function url(groupBy) {
    const query = new URLSearchParams(FILTERS);
    query.set("group_by", groupBy);
    query.set("limit", LIMIT);
    return API + "?" + query.toString();
  }

  async function get(groupBy) {
    const response = await fetch(url(groupBy), { credentials: "same-origin",
                                                 headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(response.status + " " + response.statusText);
    return (await response.json()).results;
  }

  function daySeconds(text) {
    return Date.parse(text + "T00:00:00Z") / 1000;
  }

  // Every day from the first asked for (or stored) to the last (or today), a day without use
  // at 0: a gap is no use, not a missing point.
  function columns(rows) {
    const byDay = {};
    for (const row of rows) byDay[daySeconds(row.day)] = row;
    const stored = Object.keys(byDay).map(Number).sort(function (a, b) { return a - b; });
    const today = Math.floor(Date.now() / 1000 / DAY_S) * DAY_S;
    let first = FILTERS.get("since") ? daySeconds(FILTERS.get("since")) : stored[0];
    let last = FILTERS.get("until") ? daySeconds(FILTERS.get("until")) : today;
    if (first === undefined || isNaN(first)) return null;
    last = Math.min(Math.max(last, stored.length ? stored[stored.length - 1] : first), today);
    first = Math.max(first, last - 3660 * DAY_S);
    const days = [], prompt = [], completion = [];
    for (let t = first; t <= last; t += DAY_S) {
      const row = byDay[t];
      days.push(t);
      prompt.push(row ? row.prompt_tokens : 0);
      completion.push(row ? row.completion_tokens : 0);
    }
    return [days, prompt, completion];
  }

  function format(value) {
    if (value === null || value === undefined) return "–";
    const size = Math.abs(value);
    if (size >= 1e9) return (value / 1e9).toFixed(1) + "G";
    if (size >= 1e6) return (value / 1e6).toFixed(1) + "M";
    if (size >= 1e4) return (value / 1e3).toFixed(1) + "k";
    return String(Math.round(value));
  }

  function series(label, stroke, align) {
    const bars = window.uPlot.paths && window.uPlot.paths.bars;
    return { label: label, stroke: stroke, fill: stroke + "99", width: 1,
             paths: bars ? bars({ size: [0.4, 40], align: align }) : undefined,
             points: { show: !bars }, value: function (u, v) { return format(v); } };
  }

  function draw(rows) {
    const data = columns(rows);
    const used = rows.some(function (r) { return r.prompt_tokens || r.completion_tokens; });
    note.hidden = used;
    if (!used || data === null || typeof window.uPlot === "undefined") {
      if (plot !== null) { plot.destroy(); plot = null; }
      return;
    }
    if (plot !== null && plot.data[0].length === data[0].length) {
      plot.setData(data);
      return;
    }
    if (plot !== null) plot.destroy();
    plot = new window.uPlot({
      width: chartBox.clientWidth || 720, height: 240,
      // Days are UTC days: ticks and labels in UTC, whatever the browser's zone.
      tzDate: function (t) { return window.uPlot.tzDate(new Date(t * 1000), "Etc/UTC"); },
      // Half a day either side, so that the first and last bars are whole.
      scales: { x: { time: true, range: function (u, min, max) {
        return [min - DAY_S / 2, max + DAY_S / 2]; } } },
      axes: [{ space: 80, incrs: [1, 2, 7, 14, 30, 91, 365].map(function (n) { return n * DAY_S; }),
               values: function (u, ticks) {
                 return ticks.map(function (t) { return new Date(t * 1000).toISOString().slice(0, 10); });
               } },
             { size: 56, values: function (u, ticks) { return ticks.map(format); } }],
      series: [{ label: "Day", value: "{YYYY}-{MM}-{DD}" }, series("prompt tokens", "#2f6fdf", -1),
               series("completion tokens", "#e0542c", 1)],
    }, data, chartBox);
  }

  function cell(text, code) {
    const td = document.createElement("td");
    if (code) {
      const c = document.createElement("code");
      c.textContent = code;
      td.append(text ? text + " " : "", c);
    } else {
      td.textContent = text;
    }
    return td;
  }

  function keyCell(row) {
    if (row.key_name) return cell(row.key_name, "pds_" + row.key_prefix + "…");
    if (row.key_prefix === "console0") return cell("playground");
    if (row.key_prefix) return cell("", "pds_" + row.key_prefix + "…");
    return cell("no key");
  }

  function table(rows) {
    const body = document.createElement("tbody");
    for (const row of rows) {
      const tr = document.createElement("tr");
      tr.append(cell(row.team_name || "–"), keyCell(row), cell(row.model),
                cell(String(row.requests)), cell(String(row.errors)),
                cell(String(row.prompt_tokens)), cell(String(row.completion_tokens)),
                cell(row.latency_ms_avg === null ? "–" : String(row.latency_ms_avg)));
      body.appendChild(tr);
    }
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = cell("No usage in these days.");
      td.colSpan = 8;
      tr.appendChild(td);
      body.appendChild(tr);
    }
    tbody.replaceChildren.apply(tbody, Array.from(body.children));
  }

  async function refresh() {
    try {
      const [days, groups] = await Promise.all([get("day"), get("team,key,model")]);
      draw(days);
      table(groups);
      status.textContent = "updated " + new Date().toLocaleTimeString();
      status.className = "state state-ready";
    } catch (err) {
      // The last data stays on the page; the next round tries again.
      status.textContent = "not updated (" + err.message + ")";
      status.className = "state state-failed";
    }
  }

  window.addEventListener("resize", function () {
    if (plot !== null) plot.setSize({ width: chartBox.clientWidth, height: 240 });
  });
  refresh();
  setInterval(refresh, REFRESH_MS);
})();
