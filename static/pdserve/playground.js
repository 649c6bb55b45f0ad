// Playground: streams a chat answer through the console and shows its TTFT and TPOT, measured
// the way vLLM's benchmark client does (first non-empty choices chunk; (E2E - TTFT) / (n - 1)).
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const form = document.getElementById("chat-form");
  if (!chat || !form) return;
  const messages = [];

  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = "bubble " + role;
    div.textContent = text;
    chat.appendChild(div);
    return div;
  }

  async function send(prompt) {
    messages.push({ role: "user", content: prompt });
    bubble("user", prompt);
    const answer = bubble("assistant", "");
    const stats = document.createElement("div");
    stats.className = "stats";
    chat.appendChild(stats);
    const system = form.system.value.trim();
    const body = {
      // The system prompt is the form's current one, not part of the kept history.
      messages: system ? [{ role: "system", content: system }].concat(messages) : messages,
      max_tokens: parseInt(form.max_tokens.value, 10),
      temperature: parseFloat(form.temperature.value),
    };
    const started = performance.now();
    let firstAt = null;
    let lastAt = null;
    let tokens = null;
    const response = await fetch(chat.dataset.url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": form.csrfmiddlewaretoken.value },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      answer.textContent = "error " + response.status + ": " + (await response.text());
      answer.classList.add("error");
      return;
    }
    const requestId = response.headers.get("X-Request-Id");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const data = JSON.parse(event.slice(6));
        if (data.error) {
          answer.textContent += "\n[error] " + data.error.message;
          answer.classList.add("error");
          continue;
        }
        if (data.usage) tokens = data.usage.completion_tokens;
        if (data.choices && data.choices.length) {
          const delta = data.choices[0].delta || {};
          if (delta.content) {
            const now = performance.now();
            if (firstAt === null) firstAt = now;
            lastAt = now;
            answer.textContent += delta.content;
          }
        }
      }
    }
    messages.push({ role: "assistant", content: answer.textContent });
    const ttft = firstAt === null ? null : firstAt - started;
    const tpot = tokens && tokens > 1 && lastAt !== null ? (lastAt - firstAt) / (tokens - 1) : null;
    stats.dataset.ttftMs = ttft === null ? "" : ttft.toFixed(1);
    stats.dataset.tpotMs = tpot === null ? "" : tpot.toFixed(1);
    stats.innerHTML = "";
    stats.append("TTFT " + (ttft === null ? "–" : ttft.toFixed(0) + " ms") +
                 " · TPOT " + (tpot === null ? "–" : tpot.toFixed(1) + " ms") +
                 " · " + (tokens === null ? "?" : tokens) + " tokens · ");
    const link = document.createElement("a");
    link.href = chat.dataset.timeline + "?id=" + encodeURIComponent(requestId);
    link.textContent = "timeline";
    stats.appendChild(link);
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const prompt = form.prompt.value.trim();
    if (!prompt) return;
    form.prompt.value = "";
    form.send.disabled = true;
    send(prompt).finally(function () { form.send.disabled = false; });
  });
  document.getElementById("reset").addEventListener("click", function () {
    messages.length = 0;
    chat.replaceChildren();
  });
})();
