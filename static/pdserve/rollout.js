// The rollout page: green beside blue per analysis metric (uPlot, vendored), and the state,
// weights, checks and transitions kept live from the deployment's socket ("rollout" messages).
(function () {
  "use strict";
  const root = document.getElementById("rollout");
  const dataNode = document.getElementById("rollout-data");
  if (!root || !dataNode) return;
  const rolloutId = Number(root.dataset.rollout);
  const initial = JSON.parse(dataNode.textContent);
  const METRICS = ["error_rate", "handoff_failure_rate", "ttft_p95", "itl_p95", "tpot_p95"];
  const series = {};  // metric -> [[t], [blue], [green]]
  const plots = {};

  function text(id, value) {
    const node = document.getElementById(id);
    if (node) node.textContent = value;
  }

  function addPoint(run) {
    const t = Date.parse(run.at) / 1000;
    METRICS.forEach(function (name) {
      const row = (run.metrics || {})[name];
      if (!row) return;
      const s = series[name] || (series[name] = [[], [], []]);
      s[0].push(t); s[1].push(row.blue == null ? null : row.blue);
      s[2].push(row.green == null ? null : row.green);
    });
  }

  function draw() {
    const box = document.getElementById("charts");
    if (!box || typeof uPlot === "undefined") return;
    METRICS.forEach(function (name) {
      const s = series[name] || [[], [], []];
      if (plots[name]) { plots[name].setData(s); return; }
      const holder = document.createElement("div");
      holder.id = "chart-" + name;
      box.appendChild(holder);
      plots[name] = new uPlot({
        title: name, width: 480, height: 160,
        series: [{}, {label: "blue", stroke: "#3b6fd6"}, {label: "green", stroke: "#3aa655"}],
      }, s, holder);
    });
  }

  function showState(r) {
    text("rollout-state", r.state);
    text("paused-from", r.paused_from ? "(from " + r.paused_from + ")" : "");
    text("rollout-reason", r.reason || "");
    const step = (r.steps || [])[r.step_index];
    text("rollout-step", (r.step_index + 1) + " of " + (r.steps || []).length +
      (step ? ": green " + step.weight + "%, hold " + (step.hold_s || 0) + " s" : ""));
    const blue = (r.weights || {})[r.blue] || 0, green = (r.weights || {})[r.green] || 0;
    const b = document.getElementById("weight-blue"), g = document.getElementById("weight-green");
    if (b) b.style.width = blue + "%";
    if (g) g.style.width = green + "%";
    text("weight-text", "blue r" + r.blue + " " + blue + "% · green r" + r.green + " " + green + "%");
    const failures = document.getElementById("rollout-failures");
    if (failures) failures.textContent = r.failures + " (limit " + failures.dataset.limit + ")";
    const verification = document.getElementById("rollout-verification");
    const report = r.progress && r.progress.verification;
    if (verification && report) {
      const link = document.createElement("a");
      link.href = verification.dataset.reportUrl.replace(/0\/$/, report.report + "/");
      link.textContent = "report #" + report.report;
      verification.replaceChildren(link, ": " + report.state +
        (report.verdict ? ", " + report.verdict : ""));
    }
    const gate = document.querySelector("#check-gate .verdict");
    if (gate) gate.textContent = (r.gate && r.gate.state) || "not run";
    document.querySelectorAll("#rollout-actions form").forEach(function (form) {
      form.hidden = form.dataset.states.split(" ").indexOf(r.state) < 0;
    });
  }

  // Green's workers while they start: phase and CPU, time since their start and since their
  // last progress against the deadline, redrawn every second from the stored timestamps.
  let live = initial.live || {};

  function seconds(since, now) {
    return since ? Math.max(0, Math.round((now - Date.parse(since)) / 1000)) + " s" : "—";
  }

  function showProgress() {
    const table = document.getElementById("green-workers");
    const workers = (live.progress || {}).workers || {};
    const now = Date.now();
    if (table) {
      const deadline = live.start_timeout_s || Number(table.dataset.deadline);
      const body = table.querySelector("tbody");
      Object.keys(workers).sort().forEach(function (slot) {
        const w = workers[slot];
        let tr = document.getElementById("green-" + slot);
        if (!tr) {
          const none = body.querySelector("tr.none");
          if (none) none.remove();
          tr = document.createElement("tr"); tr.id = "green-" + slot;
          ["slot", "phase", "elapsed", "idle", "restarts"].forEach(function (name) {
            const td = document.createElement("td"); td.className = name; tr.appendChild(td);
          });
          body.appendChild(tr);
        }
        const ready = w.phase === "ready";
        const cells = tr.children;
        cells[0].textContent = slot;
        // A silent worker busy on its core is computing (a compile), not hung.
        cells[1].textContent = w.phase + (!ready && typeof w.cpu === "number" ?
          " · " + Math.round(w.cpu) + " % CPU" : "");
        cells[2].textContent = ready ? "ready" : seconds(w.started_at, now);
        cells[3].textContent = ready || live.state !== "starting" ? "—" :
          seconds(w.progress_at, now) + " / " + deadline + " s";
        cells[4].textContent = w.restarts - (w.restarts_at_start || 0);
      });
    }
    const box = document.getElementById("rollout-window");
    if (box) {
      const win = (live.progress || {}).window;
      if (!win) { box.textContent = "—"; return; }
      const counts = Object.keys(win.requests || {}).map(function (k) {
        return "r" + k + " " + Math.round(win.requests[k]) + "/" + (live.min_requests || box.dataset.min);
      }).join(", ");
      box.textContent = "collecting for " + seconds(win.opened, now) + " (bound " +
        box.dataset.bound + " s)" + (counts ? ": " + counts + " requests" : "");
    }
  }

  // At most 4 decimals, as the template's floatformat:"-4" shows a stored window.
  function measure(v) {
    return typeof v === "number" ? String(Number(v.toFixed(4))) : v;
  }

  function showChecks(run) {
    const body = document.querySelector("#checks tbody");
    if (!body) return;
    Object.keys(run.metrics || {}).sort().forEach(function (name) {
      const row = run.metrics[name];
      let tr = document.getElementById("check-" + name);
      if (!tr) { tr = document.createElement("tr"); tr.id = "check-" + name; body.appendChild(tr); }
      tr.replaceChildren();
      [name, row.verdict, measure(row.green), measure(row.blue), row.why].forEach(function (v) {
        const td = document.createElement("td");
        td.textContent = v == null ? "—" : String(v);
        tr.appendChild(td);
      });
      tr.children[1].className = "verdict";
    });
  }

  function addTransition(t) {
    const body = document.querySelector("#transitions tbody");
    if (!body) return;
    const tr = document.createElement("tr");
    const weights = Object.keys(t.weights || {}).map(function (k) { return "r" + k + " " + t.weights[k] + "%"; }).join(" ");
    [new Date(t.at).toISOString().replace("T", " ").slice(0, 19), t.from_state, t.to_state,
     t.actor, t.reason, weights].forEach(function (v) {
      const td = document.createElement("td");
      td.textContent = v; tr.appendChild(td);
    });
    body.appendChild(tr);
  }

  (initial.analyses || []).forEach(addPoint);
  draw();
  showProgress();
  setInterval(showProgress, 1000);

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + window.location.host + root.dataset.ws);
    ws.onmessage = function (event) {
      const message = JSON.parse(event.data);
      if (message.type !== "rollout" || message.rollout.id !== rolloutId) return;
      showState(message.rollout);
      live = message.rollout;
      showProgress();
      (message.transitions || []).forEach(addTransition);
      (message.analyses || []).forEach(function (run) { addPoint(run); showChecks(run); });
      if ((message.analyses || []).length) draw();
    };
    ws.onclose = function (event) {
      if (event.code !== 4401 && event.code !== 4404) setTimeout(connect, 2000);
    };
  }
  connect();
})();
