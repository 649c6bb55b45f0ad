// Alerts, live on every page: the navigation bar's firing count and the deployment list's
// per-deployment counts follow /ws/alerts/; on the alert dashboard, a changed alert's row is
// fetched as the server renders it for this reader (with the buttons their role allows) and
// put in place, or taken out once it is inactive. Sparklines draw an alert's last 15 minutes
// with its threshold. The rule form's preview posts the unsaved rule and draws the answer.
(function () {
  "use strict";
  const ACTIVE = ["firing", "pending", "nodata"];
  const countsTag = document.getElementById("firing-counts");
  const counts = countsTag ? JSON.parse(countsTag.textContent) : {};

  function showCounts() {
    const total = Object.values(counts).reduce((sum, n) => sum + n, 0);
    const nav = document.getElementById("nav-alert-count");
    if (nav) {
      nav.textContent = String(total);
      nav.classList.toggle("none", total === 0);
    }
    document.querySelectorAll("[data-alert-count-deployment]").forEach((badge) => {
      const n = counts[badge.dataset.alertCountDeployment] || 0;
      badge.textContent = String(n);
      badge.classList.toggle("none", n === 0);
    });
  }

  // ---- the dashboard's rows ---------------------------------------------------------------
  const table = document.getElementById("alert-table");

  async function placeRow(alert) {
    const body = table.querySelector("tbody");
    const existing = body.querySelector(`tr[data-alert-id="${alert.id}"]`);
    const only = table.dataset.deployment;
    if (!ACTIVE.includes(alert.state) || (only && alert.deployment_name !== only)) {
      if (existing) existing.remove();
    } else {
      const response = await fetch(`/alerts/${alert.id}/row/`, { credentials: "same-origin" });
      if (!response.ok) return;
      const holder = document.createElement("tbody");
      holder.innerHTML = (await response.text()).trim();
      const row = holder.firstElementChild;
      if (existing) existing.replaceWith(row); else body.prepend(row);
      row.querySelectorAll("canvas.sparkline").forEach(drawSparkline);
    }
    const empty = document.getElementById("alert-empty");
    if (empty) empty.hidden = body.children.length > 0;
  }

  // ---- sparklines ----------------------------------------------------------------------------
  function drawSeries(canvas, points, threshold) {
    const context = canvas.getContext("2d");
    const width = canvas.width, height = canvas.height;
    context.clearRect(0, 0, width, height);
    const values = points.map((p) => p[1]).filter((v) => v !== null);
    if (!values.length) {
      context.fillStyle = "#999";
      context.font = "11px sans-serif";
      context.fillText("no data", 4, height / 2 + 4);
      return;
    }
    const low = Math.min(...values, threshold), high = Math.max(...values, threshold);
    const span = high - low || 1;
    const t0 = points[0][0], t1 = points[points.length - 1][0] || t0 + 1;
    const x = (t) => ((t - t0) / ((t1 - t0) || 1)) * (width - 2) + 1;
    const y = (v) => height - 2 - ((v - low) / span) * (height - 4);
    context.strokeStyle = "#c62828";
    context.setLineDash([3, 3]);
    context.beginPath();
    context.moveTo(0, y(threshold));
    context.lineTo(width, y(threshold));
    context.stroke();
    context.setLineDash([]);
    context.strokeStyle = "#1f5fbf";
    context.beginPath();
    let started = false;
    points.forEach(([t, v]) => {
      if (v === null) { started = false; return; }
      if (started) context.lineTo(x(t), y(v)); else context.moveTo(x(t), y(v));
      started = true;
    });
    context.stroke();
  }

  async function drawSparkline(canvas) {
    try {
      const response = await fetch(canvas.dataset.seriesUrl, { credentials: "same-origin" });
      if (!response.ok) return;
      const data = await response.json();
      drawSeries(canvas, data.points, data.threshold);
    } catch (error) {
      // The console may be restarting: the next refresh draws it.
    }
  }

  function drawAllSparklines() {
    document.querySelectorAll("canvas.sparkline").forEach(drawSparkline);
  }

  // ---- the websocket -------------------------------------------------------------------------
  function connect(delay) {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + window.location.host + "/ws/alerts/");
    socket.onopen = () => { delay = 1000; };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type !== "alerts") return;
      Object.assign(counts, message.firing);
      showCounts();
      if (table) message.alerts.forEach(placeRow);
    };
    socket.onclose = (event) => {
      if (event.code === 4401) return;  // signed out
      window.setTimeout(() => connect(Math.min(delay * 2, 30000)), delay);
    };
  }

  // ---- the rule form's preview ---------------------------------------------------------------
  const form = document.getElementById("rule-form");
  const previewButton = document.getElementById("rule-preview");
  if (form && previewButton) {
    previewButton.addEventListener("click", async () => {
      const result = document.getElementById("rule-preview-result");
      const summary = document.getElementById("rule-preview-summary");
      const list = document.getElementById("rule-preview-transitions");
      const response = await fetch(form.dataset.previewUrl, {
        method: "POST", body: new FormData(form), credentials: "same-origin",
      });
      const data = await response.json();
      result.hidden = false;
      list.innerHTML = "";
      if (!response.ok) {
        summary.textContent = "Not a valid rule: " + Object.entries(data.errors)
          .map(([field, errors]) => `${field}: ${errors.map((e) => e.message).join(" ")}`).join("; ");
        return;
      }
      const fired = data.instances.reduce((sum, i) => sum + i.fired, 0);
      summary.textContent = `${data.snapshots} snapshots of ${data.series}: it would have fired ` +
        `${fired} time(s) over ${data.instances.length} instance(s).`;
      data.instances.forEach((instance) => {
        instance.transitions.forEach((t) => {
          const item = document.createElement("li");
          const where = instance.process || instance.role || "deployment";
          item.textContent = `${new Date(t.at * 1000).toLocaleTimeString()} ${where}: ` +
            `${t.from} → ${t.to}` + (t.value === null ? "" : ` (${t.value.toPrecision(4)})`);
          list.appendChild(item);
        });
      });
      const first = data.instances[0];
      drawSeries(document.getElementById("rule-preview-chart"), first ? first.points : [],
                 data.threshold);
    });
  }

  showCounts();
  drawAllSparklines();
  window.setInterval(drawAllSparklines, 15000);
  connect(1000);
})();
