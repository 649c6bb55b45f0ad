// Deployment dashboard: the chosen window's history over REST when the page opens, then one
// point a second from the deployment's websocket. Charts are uPlot, vendored in static/vendor.
(function () {
  "use strict";
  const root = document.getElementById("dashboard");
  if (!root || typeof window.uPlot === "undefined") return;
  const status = document.getElementById("dashboard-status");
  const WINDOW_S = { "15m": 900, "1h": 3600, "24h": 86400, "7d": 604800 };
  const COLORS = ["#2f6fdf", "#e0542c", "#2a9d55", "#8e44ad", "#d4a017", "#17a2b8", "#c2185b",
                  "#5d6d7e", "#7cb342", "#ff8f00"];
  const HEIGHT = 200;

  // ---- what each chart shows: label -> value, from one snapshot's processes ----------------
  function workers(processes) {
    return Object.keys(processes).sort()
      .filter(function (slot) { return processes[slot].role !== "router"; })
      .map(function (slot) { return [slot, processes[slot]]; });
  }

  function put(out, label, entry, key, scale) {
    if (!entry || !(key in entry)) return;
    const value = entry[key];
    out[label] = value === null || value === undefined ? null : value * (scale || 1);
  }

  const CHARTS = [
    { title: "Requests/s", series: function (p) {
      const out = {};
      const router = p.router;
      if (router) {
        for (const [code, rate] of Object.entries(router.rps_by_status || {})) out["router " + code] = rate;
        put(out, "PD fallbacks", router, "fallback_ps");
      }
      for (const [slot, w] of workers(p)) put(out, slot + " finished", w, "rps");
      return out;
    } },
    { title: "TTFT p50 / p95 (s)", series: function (p) {
      const out = {};
      put(out, "router p50", p.router, "ttft_p50");
      put(out, "router p95", p.router, "ttft_p95");
      for (const [slot, w] of workers(p)) {
        put(out, slot + " p50", w, "ttft_p50");
        put(out, slot + " p95", w, "ttft_p95");
      }
      return out;
    } },
    { title: "TPOT p50 / p95 (s)", series: function (p) {
      const out = {};
      // A prefill worker generates one token per request: it has no time per output token.
      for (const [slot, w] of workers(p)) {
        if (w.role === "prefill") continue;
        put(out, slot + " p50", w, "tpot_p50");
        put(out, slot + " p95", w, "tpot_p95");
      }
      return out;
    } },
    { title: "Queue depth per role", series: function (p) {
      const out = {};
      for (const [, w] of workers(p)) {
        for (const key of ["running", "waiting"]) {
          const label = w.role + " " + key;
          if (w[key] !== null && w[key] !== undefined) out[label] = (out[label] || 0) + w[key];
          else if (!(label in out)) out[label] = null;
        }
      }
      return out;
    } },
    { title: "KV cache usage (%)", series: function (p) {
      const out = {};
      for (const [slot, w] of workers(p)) put(out, slot, w, "kv_usage", 100);
      return out;
    } },
    { title: "KV hand-off time (s)", series: function (p) {
      const out = {};
      put(out, "prefill answer p50", p.router, "handoff_p50");
      put(out, "prefill answer p95", p.router, "handoff_p95");
      for (const [slot, w] of workers(p)) put(out, slot + " NIXL transfer p50", w, "nixl_xfer_p50");
      return out;
    } },
    { title: "KV transferred (bytes/s)",
      empty: "no NIXL transfers: the shared-storage channel moves KV through files",
      series: function (p) {
        const out = {};
        for (const [slot, w] of workers(p)) {
          put(out, slot, w, "nixl_bytes_ps");
          put(out, slot + " failed/s", w, "nixl_failed_ps");
        }
        return out;
      } },
    { title: "Tokens/s", series: function (p) {
      const out = {};
      for (const [slot, w] of workers(p)) {
        put(out, slot + " prompt", w, "prompt_tps");
        put(out, slot + " generated", w, "gen_tps");
      }
      return out;
    } },
    { title: "CPU (% of one core)", series: function (p) {
      const out = {};
      for (const slot of Object.keys(p).sort()) put(out, slot, p[slot], "cpu");
      return out;
    } },
    { title: "Memory (RSS, MiB)", series: function (p) {
      const out = {};
      for (const slot of Object.keys(p).sort()) put(out, slot, p[slot], "rss", 1 / 1048576);
      return out;
    } },
  ];

  function format(value) {
    if (value === null || value === undefined) return "–";
    const size = Math.abs(value);
    if (size >= 1e9) return (value / 1e9).toFixed(1) + "G";
    if (size >= 1e6) return (value / 1e6).toFixed(1) + "M";
    if (size >= 1e4) return (value / 1e3).toFixed(1) + "k";
    if (size === 0 || size >= 100) return value.toFixed(0);
    return value.toPrecision(3);
  }

  // ---- one chart: columns grow a point per sample; a new series rebuilds the plot -------------
  function Chart(spec, container) {
    this.spec = spec;
    this.labels = [];
    this.times = [];
    this.columns = [];
    this.plot = null;
    this.rebuild = false;
    this.box = document.createElement("section");
    this.box.className = "chart";
    const title = document.createElement("h3");
    title.textContent = spec.title;
    this.note = document.createElement("p");
    this.note.className = "meta";
    this.note.textContent = spec.empty || "no data yet";
    this.body = document.createElement("div");
    this.box.append(title, this.note, this.body);
    container.appendChild(this.box);
  }

  Chart.prototype.add = function (t, processes) {
    const values = this.spec.series(processes);
    for (const label of Object.keys(values)) {
      if (this.labels.indexOf(label) === -1) {
        this.labels.push(label);
        this.columns.push(new Array(this.times.length).fill(null));
        this.rebuild = true;
      }
    }
    this.times.push(t);
    for (let i = 0; i < this.labels.length; i++) {
      const value = values[this.labels[i]];
      this.columns[i].push(value === undefined ? null : value);
    }
  };

  Chart.prototype.trim = function (from) {
    let n = 0;
    while (n < this.times.length && this.times[n] < from) n++;
    if (n === 0) return;
    this.times.splice(0, n);
    for (const column of this.columns) column.splice(0, n);
  };

  Chart.prototype.clear = function () {
    this.times = [];
    this.columns = this.columns.map(function () { return []; });
  };

  Chart.prototype.options = function () {
    return {
      width: this.body.clientWidth || 560,
      height: HEIGHT,
      scales: { x: { time: true } },
      axes: [{}, { size: 56, values: function (u, ticks) { return ticks.map(format); } }],
      series: [{}].concat(this.labels.map(function (label, i) {
        return { label: label, stroke: COLORS[i % COLORS.length], width: 1.5,
                 value: function (u, v) { return format(v); } };
      })),
    };
  };

  Chart.prototype.draw = function () {
    this.note.hidden = this.labels.length > 0;
    if (!this.labels.length) return;
    const data = [this.times].concat(this.columns);
    if (this.plot === null || this.rebuild) {
      if (this.plot !== null) this.plot.destroy();
      this.plot = new window.uPlot(this.options(), data, this.body);
      this.rebuild = false;
    } else {
      this.plot.setData(data);
    }
  };

  Chart.prototype.resize = function () {
    if (this.plot !== null) this.plot.setSize({ width: this.body.clientWidth, height: HEIGHT });
  };

  // ---- the prefill -> decode pairing table ------------------------------------------------------
  const pairs = document.querySelector("#pairs tbody");

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function renderPairs(processes) {
    const rows = processes.router && processes.router.handoffs;
    if (!rows || !rows.length) {
      const tr = document.createElement("tr");
      tr.append(cell("no hand-offs yet", "meta"));
      tr.firstChild.colSpan = 5;
      pairs.replaceChildren(tr);
      return;
    }
    pairs.replaceChildren(...rows.map(function (row) {
      const tr = document.createElement("tr");
      const failure = row.last_failure;
      tr.append(
        cell(row.prefill_slot ? row.prefill_slot + " (" + row.prefill + ")" : row.prefill),
        cell(row.decode_slot ? row.decode_slot + " (" + row.decode + ")" : row.decode),
        cell(String(row.ok + row.failed)),
        cell(String(row.failed), row.failed ? "error" : ""),
        cell(failure ? new Date(failure.at).toLocaleString() + ": " + failure.error : "—"),
      );
      return tr;
    }));
  }

  // ---- data flow ---------------------------------------------------------------------------------
  const charts = CHARTS.map(function (spec) { return new Chart(spec, document.getElementById("charts")); });
  const state = { window: "15m", last: 0, latest: {}, loading: 0, queued: [], retryMs: 1000,
                  opened: false, charts: charts };
  // For browser tests: the charts' columns show which points arrived.
  window.pdserveDashboard = state;

  function setStatus(text, kind) {
    status.textContent = text;
    status.className = "state state-" + kind;
  }

  function addSample(at, data) {
    const t = Date.parse(at) / 1000;
    if (!(t > state.last)) return false;   // already shown (history and socket overlap)
    state.last = t;
    state.latest = (data && data.processes) || {};
    for (const chart of charts) chart.add(t, state.latest);
    return true;
  }

  function redraw() {
    const from = Date.now() / 1000 - WINDOW_S[state.window];
    for (const chart of charts) {
      chart.trim(from);
      chart.draw();
    }
    renderPairs(state.latest);
  }

  async function loadHistory(windowName) {
    state.loading += 1;
    try {
      const response = await fetch(root.dataset.history + "?window=" + windowName,
                                   { credentials: "same-origin" });
      if (response.ok) {
        const page = await response.json();
        for (const sample of page.samples) addSample(sample.at, sample.data);
      }
    } catch (error) {
      // The console may be restarting; the socket keeps bringing new points meanwhile.
    } finally {
      state.loading -= 1;
      const queued = state.queued;
      state.queued = [];
      for (const message of queued) addSample(message.at, message.data);
      redraw();
    }
  }

  function receive(message) {
    if (message.type !== "metrics") return;
    if (state.loading) {
      state.queued.push(message);
      return;
    }
    if (addSample(message.at, message.data)) redraw();
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + window.location.host + root.dataset.ws);
    ws.onopen = function () {
      state.retryMs = 1000;
      setStatus("live", "ready");
      // After a drop, fetch the seconds missed meanwhile (1 s samples cover 15 minutes).
      if (state.opened) loadHistory("15m");
      state.opened = true;
    };
    ws.onmessage = function (event) { receive(JSON.parse(event.data)); };
    ws.onclose = function (event) {
      if (event.code === 4401) { setStatus("logged out", "failed"); return; }
      if (event.code === 4404) { setStatus("deployment deleted", "failed"); return; }
      setStatus("reconnecting in " + Math.round(state.retryMs / 1000) + " s", "starting");
      window.setTimeout(connect, state.retryMs);
      state.retryMs = Math.min(state.retryMs * 2, 30000);
    };
  }

  document.querySelectorAll("#dashboard-windows button").forEach(function (button) {
    button.addEventListener("click", function () {
      document.querySelectorAll("#dashboard-windows button").forEach(function (other) {
        other.classList.toggle("selected", other === button);
      });
      state.window = button.dataset.window;
      state.last = 0;
      for (const chart of charts) chart.clear();
      loadHistory(state.window);
    });
  });

  let resizing = 0;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizing);
    resizing = window.setTimeout(function () { charts.forEach(function (c) { c.resize(); }); }, 150);
  });

  // Opened from an alert (?at=<when it began>): the shortest window that still shows it.
  const at = Date.parse(new URLSearchParams(window.location.search).get("at") || "");
  if (!Number.isNaN(at)) {
    const age = Date.now() / 1000 - at / 1000;
    const fits = Object.keys(WINDOW_S).filter(function (name) { return WINDOW_S[name] >= age; });
    state.window = fits.length ? fits[0] : Object.keys(WINDOW_S).pop();
    document.querySelectorAll("#dashboard-windows button").forEach(function (button) {
      button.classList.toggle("selected", button.dataset.window === state.window);
    });
  }

  // Points the socket brings while the history loads are queued, not lost.
  loadHistory(state.window);
  connect();
})();
