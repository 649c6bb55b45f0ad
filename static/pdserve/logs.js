// Live log tail: websocket for new lines, REST backfill by sequence number for anything missed
// (a dropped socket, or lines the server skipped under a flood). Every line shows exactly once.
(function () {
  "use strict";
  const element = document.getElementById("log");
  if (!element) return;
  const status = document.getElementById("log-status");
  const MAX_SHOWN = 5000;

  const tail = {
    lastSeq: 0,
    shown: 0,
    ws: null,
    backfilling: false,
    queued: [],
    retryMs: 500,
    searching: false,
  };
  window.pdserveLogTail = tail;

  function setStatus(text, state) {
    status.textContent = text;
    status.className = "state state-" + state;
  }

  function append(seq, created, text) {
    if (seq !== tail.lastSeq + 1 && tail.lastSeq !== 0) return false;
    const row = document.createElement("div");
    row.className = "logline";
    row.dataset.seq = String(seq);
    row.title = created;
    row.textContent = text;
    const atBottom = element.scrollTop + element.clientHeight >= element.scrollHeight - 4;
    element.appendChild(row);
    tail.lastSeq = seq;
    tail.shown += 1;
    while (element.childElementCount > MAX_SHOWN) element.removeChild(element.firstChild);
    if (atBottom) element.scrollTop = element.scrollHeight;
    return true;
  }

  async function backfill() {
    if (tail.backfilling) return;
    tail.backfilling = true;
    try {
      for (;;) {
        const response = await fetch(element.dataset.api + "?after=" + tail.lastSeq + "&limit=2000",
                                     { credentials: "same-origin" });
        if (!response.ok) throw new Error("backfill " + response.status);
        const page = await response.json();
        for (const line of page.lines) {
          if (line.seq > tail.lastSeq) append(line.seq, line.created, line.text);
        }
        if (!page.has_more) break;
      }
    } finally {
      tail.backfilling = false;
    }
    const queued = tail.queued;
    tail.queued = [];
    queued.forEach(receive);
  }

  function receive(message) {
    if (message.type !== "log" || tail.searching) return;
    if (tail.backfilling) {
      tail.queued.push(message);
      return;
    }
    for (const [seq, created, text] of message.lines) {
      if (seq <= tail.lastSeq) continue;          // already shown (from a backfill)
      if (seq > tail.lastSeq + 1) {               // a gap: fetch it, then replay this message
        tail.queued.push(message);
        backfill();
        return;
      }
      append(seq, created, text);
    }
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + window.location.host + element.dataset.ws);
    tail.ws = ws;
    ws.onopen = function () {
      tail.retryMs = 500;
      setStatus("live", "ready");
      backfill();   // whatever was written while we were away
    };
    ws.onmessage = function (event) { receive(JSON.parse(event.data)); };
    ws.onclose = function (event) {
      if (event.code === 4401) { setStatus("logged out", "failed"); return; }
      setStatus("reconnecting", "starting");
      window.setTimeout(connect, tail.retryMs);
      tail.retryMs = Math.min(tail.retryMs * 2, 10000);
    };
  }

  async function start() {
    const response = await fetch(element.dataset.api + "?tail=200", { credentials: "same-origin" });
    if (response.ok) {
      const page = await response.json();
      if (page.lines.length) tail.lastSeq = page.lines[0].seq - 1;
      for (const line of page.lines) append(line.seq, line.created, line.text);
    }
    connect();
  }

  const search = document.getElementById("log-search");
  search.addEventListener("submit", async function (event) {
    event.preventDefault();
    const query = new FormData(search).get("q");
    if (!query) return;
    tail.searching = true;
    setStatus("search results (live paused)", "stopped");
    const response = await fetch(element.dataset.api + "?q=" + encodeURIComponent(query) +
                                 "&limit=2000", { credentials: "same-origin" });
    const page = await response.json();
    element.replaceChildren(...page.lines.map(function (line) {
      const row = document.createElement("div");
      row.className = "logline match";
      row.textContent = "#" + line.seq + "  " + line.text;
      return row;
    }));
  });
  document.getElementById("log-search-clear").addEventListener("click", function () {
    window.location.reload();
  });

  start();
})();
