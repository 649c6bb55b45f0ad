// Gateway page: each deployment's traffic through the gateway and its queue, from
// /api/v1/gateway/traffic/, redrawn every 2 s without a reload.
(function () {
  "use strict";
  const root = document.getElementById("gateway-traffic");
  if (!root) return;
  const API = root.dataset.api;
  const REFRESH_MS = 2000;
  const tbody = root.querySelector("tbody");
  const status = document.getElementById("gateway-traffic-status");

  function rate(value) {
    return value === null || value === undefined ? "–" : value.toFixed(2);
  }

  function cell(row, text, name) {
    const td = document.createElement("td");
    td.textContent = text;
    if (name) td.className = name;
    row.appendChild(td);
  }

  function render(body) {
    status.textContent = "gateway " + body.gateway;
    tbody.replaceChildren();
    for (const entry of body.deployments) {
      const row = document.createElement("tr");
      row.dataset.deployment = entry.deployment;
      cell(row, entry.deployment);
      cell(row, rate(entry.rps), "rps");
      cell(row, rate(entry.shed_ps), "shed");
      const holding = entry.in_flight_by_flow.map(function (h) {
        return h.flow + ": " + h.requests;
      });
      cell(row, entry.limit === null ? "no queue" : entry.in_flight + " of " + entry.limit
           + (holding.length ? " (" + holding.join(", ") + ")" : ""), "in-flight");
      const waiting = entry.waiting.map(function (w) {
        return w.band + "/" + w.flow + ": " + w.requests;
      });
      cell(row, waiting.length ? waiting.join(", ") : "none", "waiting");
      tbody.appendChild(row);
    }
  }

  async function refresh() {
    try {
      const response = await fetch(API, { credentials: "same-origin",
                                          headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(response.status + " " + response.statusText);
      render(await response.json());
    } catch (error) {
      status.textContent = "could not read the traffic: " + error.message;
    }
  }

  refresh();
  setInterval(refresh, REFRESH_MS);
})();
