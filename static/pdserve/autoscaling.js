// The autoscaler's decisions, newest first (the autoscaling page and the deployment page's
// events list), and on the autoscaling page each pool's signal over the last hour with its
// thresholds (uPlot, vendored). Both stay live on the deployment's socket: "scaling.decision"
// adds or replaces a row (a decision is extended and its progress followed after it is made),
// "scaling.reading" adds a point. After a dropped socket the decisions are fetched again.
(function () {
  "use strict";
  const root = document.querySelector("[data-scaling-ws]");
  if (!root) return;
  const HOUR_S = 3600;
  const status = document.getElementById("scaling-status");
  const tables = Array.from(document.querySelectorAll("table.scaling-decisions"));
  const sources = {};  // json_script id -> its data
  tables.forEach(function (table) {
    const node = document.getElementById(table.dataset.source);
    sources[table.dataset.source] = node ? JSON.parse(node.textContent) : {};
  });
  const charts = {};  // role -> {times, values, up, down, plot, box}
  const latest = {};  // role -> the newest decision shown, for the pool's "desired"
  // For browser tests: which points each chart holds.
  window.pdserveAutoscaling = { charts: charts };

  function utc(iso) { return new Date(iso).toISOString().replace("T", " ").slice(0, 19); }

  function number(value) {
    return value === null || value === undefined ? "no data" : String(Number(value.toPrecision(4)));
  }

  // {"windows": {"up_s": 60}, "why": "..."} -> ["windows.up_s=60", "why=..."]
  function compact(object, prefix) {
    return Object.keys(object || {}).sort().flatMap(function (key) {
      const value = object[key], name = prefix + key;
      if (value !== null && typeof value === "object" && !Array.isArray(value)) {
        return compact(value, name + ".");
      }
      return [name + "=" + (typeof value === "string" ? value : JSON.stringify(value))];
    });
  }

  function progress(entries) {
    return Object.keys(entries || {}).sort(function (a, b) {
      return Date.parse(entries[a]) - Date.parse(entries[b]);
    }).map(function (key) { return key.replace(/_at$/, "") + " " + utc(entries[key]).slice(11); });
  }

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function cells(d) {
    const when = cell(utc(d.at), "at");
    if (d.evaluations > 1) when.textContent += " ×" + d.evaluations + " to " + utc(d.last_at).slice(11);
    const action = cell(d.action, "action");
    if (d.dry_run) {
      const badge = document.createElement("span");
      badge.className = "state dry-run";
      badge.textContent = "dry run";
      action.append(" ", badge);
    }
    return [when, cell(d.role, "role"), action, cell(d.current + " → " + d.target, "count"),
            cell(String(d.desired), "desired"), cell(d.reason, "reason"), cell(d.detail, "detail"),
            cell(compact(d.inputs, "").join(" "), "inputs"), cell(progress(d.progress).join(" · "), "progress")];
  }

  function newer(a, b) {  // whether decision a sorts before (is newer than) b
    const ta = Date.parse(a.at), tb = Date.parse(b.at);
    return ta > tb || (ta === tb && a.id > b.id);
  }

  function place(table, d) {
    const body = table.tBodies[0];
    let row = body.querySelector('tr[data-id="' + d.id + '"]');
    if (!row) {
      row = document.createElement("tr");
      row.dataset.id = String(d.id);
      const after = Array.from(body.querySelectorAll("tr[data-id]")).find(function (other) {
        return newer(d, { at: other.dataset.at, id: Number(other.dataset.id) });
      });
      body.insertBefore(row, after || null);
    }
    row.dataset.at = d.at;
    row.className = "decision action-" + d.action + (d.dry_run ? " dry-run" : "");
    row.replaceChildren(...cells(d));
    const rows = body.querySelectorAll("tr[data-id]");
    for (let i = Number(table.dataset.limit); i < rows.length; i++) rows[i].remove();
    body.querySelector("tr.empty").hidden = rows.length > 0;
  }

  function text(id, value) {
    const node = document.getElementById(id);
    if (node) node.textContent = value;
  }

  function showDecision(d) {
    tables.forEach(function (table) { place(table, d); });
    if (!latest[d.role] || !newer(latest[d.role], d)) {
      latest[d.role] = d;
      text("pool-" + d.role + "-desired", String(d.desired));
    }
  }

  // ---- the charts ----------------------------------------------------------------------------
  function chartOf(role) {
    const box = document.getElementById("chart-" + role);
    if (!box) return null;
    return charts[role] || (charts[role] = { times: [], values: [], up: [], down: [], plot: null, box: box });
  }

  function addReading(r) {
    text("pool-" + r.role + "-current", String(r.current));
    text("pool-" + r.role + "-ready", String(r.ready));
    text("pool-" + r.role + "-value", number(r.value) + (r.asked === null ? "" : " (asks for " + r.asked + ")"));
    const chart = chartOf(r.role);
    if (!chart) return null;
    const t = Date.parse(r.at) / 1000;
    if (chart.times.length && t <= chart.times[chart.times.length - 1]) return null;
    chart.times.push(t); chart.values.push(r.value);
    chart.up.push(r.scale_up_at); chart.down.push(r.scale_down_at);
    let old = 0;
    while (old < chart.times.length && chart.times[old] < t - HOUR_S) old++;
    ["times", "values", "up", "down"].forEach(function (key) { chart[key].splice(0, old); });
    return chart;
  }

  function draw(chart) {
    if (typeof window.uPlot === "undefined") return;
    const data = [chart.times, chart.values, chart.up, chart.down];
    if (chart.plot) { chart.plot.setData(data); return; }
    chart.box.replaceChildren();
    const threshold = { dash: [6, 4], points: { show: false } };
    chart.plot = new window.uPlot({
      width: chart.box.clientWidth || 560, height: 180, scales: { x: { time: true } },
      // UTC, as the decisions' times are.
      tzDate: function (t) { return window.uPlot.tzDate(new Date(t * 1000), "Etc/UTC"); },
      series: [{}, { label: "signal", stroke: "#2f6fdf", width: 1.5 },
               Object.assign({ label: "scale up at", stroke: "#c62828" }, threshold),
               Object.assign({ label: "scale down at", stroke: "#2a9d55" }, threshold)],
    }, data, chart.box);
  }

  // ---- data flow ---------------------------------------------------------------------------------
  Object.values(sources).forEach(function (data) {
    (data.decisions || []).forEach(showDecision);
    const drawn = new Set();
    (data.readings || []).forEach(function (r) {
      const chart = addReading(r);
      if (chart) drawn.add(chart);
    });
    drawn.forEach(draw);
  });

  async function backfill() {
    try {
      const response = await fetch(root.dataset.decisionsUrl, { credentials: "same-origin" });
      if (response.ok) (await response.json()).results.reverse().forEach(showDecision);
    } catch (error) {
      // The console may be restarting; the socket brings what changes next.
    }
  }

  function setStatus(value, kind) {
    if (!status) return;
    status.textContent = value;
    status.className = "state state-" + kind;
  }

  let retryMs = 1000, opened = false;
  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + window.location.host + root.dataset.scalingWs);
    ws.onopen = function () {
      retryMs = 1000;
      setStatus("live", "ready");
      if (opened) backfill();
      opened = true;
    };
    ws.onmessage = function (event) {
      const message = JSON.parse(event.data);
      if (message.type === "scaling.decision") showDecision(message.decision);
      if (message.type === "scaling.reading") {
        const chart = addReading(message.reading);
        if (chart) draw(chart);
      }
    };
    ws.onclose = function (event) {
      if (event.code === 4401) { setStatus("logged out", "failed"); return; }
      if (event.code === 4404) { setStatus("deployment deleted", "failed"); return; }
      setStatus("reconnecting", "starting");
      window.setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    };
  }
  connect();
})();
