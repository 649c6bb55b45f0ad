// Partial updates: any element with data-refresh-url is re-fetched and replaced in place, until
// what it gets back holds a data-refresh-stop marker (the thing waited for is there).
(function () {
  "use strict";
  function refresh(element) {
    const url = element.dataset.refreshUrl;
    const every = parseInt(element.dataset.refreshMs || "2000", 10);
    async function tick() {
      try {
        const response = await fetch(url, { credentials: "same-origin" });
        if (response.ok) {
          element.innerHTML = await response.text();
          if (element.querySelector("[data-refresh-stop]")) return;
        }
      } catch (error) {
        // The console may be restarting; the next tick tries again.
      }
      window.setTimeout(tick, every);
    }
    window.setTimeout(tick, every);
  }
  document.querySelectorAll("[data-refresh-url]").forEach(refresh);
})();
