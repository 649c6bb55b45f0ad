// The plan editor: re-check the plan as the form changes, add instance rows with proposed
// ports and devices, and show only the pools the chosen mode uses.
(function () {
  "use strict";
  const form = document.getElementById("plan-form");
  if (!form) {
    return;
  }
  const checks = document.getElementById("checks");
  const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  const POOLS = { pd: ["prefill", "decode"], colocated: ["colocated"] };
  let timer = null;
  let sent = 0;  // responses to older requests are dropped, so the table shows the latest form

  async function post(url, body) {
    return fetch(url, {
      method: "POST", body: body, credentials: "same-origin",
      headers: { "X-CSRFToken": csrf },
    });
  }

  async function check() {
    const mine = ++sent;
    try {
      const response = await post(form.dataset.checkUrl, new FormData(form));
      const html = await response.text();
      if (mine === sent) {
        checks.innerHTML = html;
      }
    } catch (error) {
      // The console may be restarting; the next edit checks again.
    }
  }

  function soon() {
    window.clearTimeout(timer);
    timer = window.setTimeout(check, 300);
  }

  function showPools() {
    const mode = form.querySelector("[name=mode]").value;
    form.querySelectorAll("fieldset.pool").forEach(function (pool) {
      pool.hidden = !(POOLS[mode] || []).includes(pool.dataset.role);
    });
  }

  async function addInstance(pool) {
    const role = pool.dataset.role;
    const total = pool.querySelector(`[name="${role}-instances-TOTAL_FORMS"]`);
    const index = parseInt(total.value, 10);
    const template = pool.querySelector("template[data-empty-row]");
    const rows = pool.querySelector("[data-rows]");
    rows.insertAdjacentHTML("beforeend", template.innerHTML.replace(/__prefix__/g, String(index)));
    total.value = String(index + 1);
    const prefix = `${role}-instances-${index}-`;
    const body = new FormData(form);
    body.append("role", role);
    body.append("node", form.querySelector(`[name="${prefix}node"]`).value);
    const response = await post(form.dataset.proposeUrl, body);
    if (response.ok) {
      const proposal = await response.json();
      for (const name of ["node", "cpu_cores", "gpu_indices", "port", "side_channel_port"]) {
        const input = form.querySelector(`[name="${prefix}${name}"]`);
        if (input && proposal[name] !== undefined && proposal[name] !== null) {
          input.value = String(proposal[name]);
        }
      }
    }
    soon();
  }

  form.addEventListener("input", soon);
  form.addEventListener("change", function (event) {
    if (event.target.name === "mode") {
      showPools();
    }
    soon();
  });
  form.querySelectorAll("[data-add-instance]").forEach(function (button) {
    button.addEventListener("click", function () {
      addInstance(button.closest("fieldset.pool"));
    });
  });
  showPools();
  if (!checks.querySelector("table")) {
    check();
  }
})();
