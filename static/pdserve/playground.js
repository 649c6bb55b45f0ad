// Playground: streams a chat answer through the console and shows its TTFT and TPOT, measured
// the way vLLM's benchmark client does (first non-empty choices chunk; (E2E - TTFT) / (n - 1)).
// Where the deployment's model takes images (#attach is on the page), images picked or pasted
// into the prompt go with the next message as OpenAI content parts (data URLs).
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const form = document.getElementById("chat-form");
  if (!chat || !form) return;
  const messages = [];
  const picker = document.getElementById("attach");
  const tray = document.getElementById("attachments");
  // Attached, not sent yet: {name, url (data URL)}; and those still being read.
  const pending = [];
  let reading = 0;

  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = "bubble " + role;
    div.textContent = text;
    chat.appendChild(div);
    return div;
  }

  function thumbnail(url, name) {
    const img = document.createElement("img");
    img.className = "thumb";
    img.src = url;
    img.alt = name || "image";
    return img;
  }

  function showPending() {
    if (!tray) return;
    tray.replaceChildren();
    pending.forEach(function (image, index) {
      const item = document.createElement("span");
      item.className = "attachment";
      item.dataset.name = image.name;
      item.appendChild(thumbnail(image.url, image.name));
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "remove-image";
      remove.textContent = "×";
      remove.title = "remove " + image.name;
      remove.setAttribute("aria-label", "remove " + image.name);
      remove.addEventListener("click", function () {
        pending.splice(index, 1);
        showPending();
      });
      item.appendChild(remove);
      tray.appendChild(item);
    });
  }

  // The router counts a request's images over all its messages: the history's go again.
  function sentImages() {
    return messages.reduce(function (count, message) {
      return count + (Array.isArray(message.content)
        ? message.content.filter(function (part) { return part.type === "image_url"; }).length
        : 0);
    }, 0);
  }

  function attach(files) {
    const note = document.getElementById("attach-note");
    const room = parseInt(chat.dataset.maxImages, 10) - sentImages() - pending.length - reading;
    const images = Array.from(files).filter(function (file) {
      return file.type.startsWith("image/");
    });
    note.hidden = images.length <= room;
    note.textContent = images.length <= room ? "" :
      "The router takes at most " + chat.dataset.maxImages + " image(s) a request, this " +
      "conversation's earlier ones included: " + Math.max(room, 0) + " more attached of " +
      images.length + " (New chat starts over).";
    images.slice(0, Math.max(room, 0))
      .forEach(function (file) {
        const reader = new FileReader();
        reading += 1;
        reader.addEventListener("loadend", function () {
          reading -= 1;
          if (reader.result) pending.push({ name: file.name || "pasted image", url: reader.result });
          showPending();
        });
        reader.readAsDataURL(file);
      });
  }

  if (picker) {
    picker.addEventListener("change", function () {
      attach(picker.files);
      picker.value = ""; // the same file may be picked again
    });
    form.prompt.addEventListener("paste", function (event) {
      const data = event.clipboardData;
      if (!data) return;
      const images = Array.from(data.files || []).filter(function (f) {
        return f.type.startsWith("image/");
      });
      if (!images.length) return;
      attach(images);
      // A pasted image alone must not also paste its file name as text.
      if (!data.getData("text/plain")) event.preventDefault();
    });
  }

  // A 4xx of the console's API: DRF's field errors ({"messages": [{"content": [...]}]}) as
  // "messages[0].content: ..." lines.
  function readable(text) {
    let parsed;
    try { parsed = JSON.parse(text); } catch (e) { return text; }
    const lines = [];
    (function walk(value, path) {
      if (typeof value === "string") {
        lines.push((path ? path + ": " : "") + value);
      } else if (Array.isArray(value)) {
        const strings = value.every(function (v) { return typeof v === "string"; });
        value.forEach(function (v, i) { walk(v, strings ? path : path + "[" + i + "]"); });
      } else if (value && typeof value === "object") {
        Object.keys(value).forEach(function (k) { walk(value[k], path ? path + "." + k : k); });
      }
    })(parsed, "");
    return lines.length ? lines.join("\n") : text;
  }

  async function send(prompt, images) {
    const content = images.length
      ? [{ type: "text", text: prompt }].concat(images.map(function (image) {
        return { type: "image_url", image_url: { url: image.url } };
      }))
      : prompt;
    const mine = { role: "user", content: content };
    messages.push(mine);
    const asked = bubble("user", prompt);
    if (images.length) {
      const row = document.createElement("div");
      row.className = "thumbs";
      images.forEach(function (image) { row.appendChild(thumbnail(image.url, image.name)); });
      asked.appendChild(row);
    }
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
    // A refused turn leaves the history: its images would be refused again with every turn.
    function refused(text) {
      answer.textContent += (answer.textContent ? "\n" : "") + text;
      answer.classList.add("error");
      messages.splice(messages.indexOf(mine), 1);
    }
    const payload = JSON.stringify(body);
    const limit = parseInt(chat.dataset.maxBody, 10);
    if (payload.length > limit) {
      // Refused here rather than uploaded for the console to refuse (it checks again).
      refused("error: the message with its images is " + payload.length + " bytes; the router " +
              "accepts at most " + limit + ": send fewer or smaller images");
      return;
    }
    const started = performance.now();
    let firstAt = null;
    let lastAt = null;
    let tokens = null;
    let promptTokens = null;
    let failed = false;
    const response = await fetch(chat.dataset.url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": form.csrfmiddlewaretoken.value },
      body: payload,
    });
    if (!response.ok) {
      refused("error " + response.status + ": " + readable(await response.text()));
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
      // Per streamed chunk: keep this loop light.
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const data = JSON.parse(event.slice(6));
        if (data.error) {
          failed = true;
          refused("[error] " + data.error.message);
          continue;
        }
        if (data.usage) {
          tokens = data.usage.completion_tokens;
          promptTokens = data.usage.prompt_tokens;
        }
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
    if (!failed) messages.push({ role: "assistant", content: answer.textContent });
    const ttft = firstAt === null ? null : firstAt - started;
    const tpot = tokens && tokens > 1 && lastAt !== null ? (lastAt - firstAt) / (tokens - 1) : null;
    stats.dataset.ttftMs = ttft === null ? "" : ttft.toFixed(1);
    stats.dataset.tpotMs = tpot === null ? "" : tpot.toFixed(1);
    stats.dataset.promptTokens = promptTokens === null ? "" : String(promptTokens);
    stats.dataset.images = String(images.length);
    stats.innerHTML = "";
    stats.append("TTFT " + (ttft === null ? "–" : ttft.toFixed(0) + " ms") +
                 " · TPOT " + (tpot === null ? "–" : tpot.toFixed(1) + " ms") +
                 " · " + (tokens === null ? "?" : tokens) + " tokens · prompt " +
                 (promptTokens === null ? "?" : promptTokens) + " tokens" +
                 (images.length ? " (" + images.length + (images.length === 1 ? " image" : " images") +
                  ")" : "") + " · ");
    const link = document.createElement("a");
    link.href = chat.dataset.timeline + "?id=" + encodeURIComponent(requestId);
    link.textContent = "timeline";
    stats.appendChild(link);
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const prompt = form.prompt.value.trim();
    if (!prompt) return;
    const images = pending.splice(0, pending.length);
    showPending();
    form.prompt.value = "";
    form.send.disabled = true;
    send(prompt, images).finally(function () { form.send.disabled = false; });
  });
  document.getElementById("reset").addEventListener("click", function () {
    messages.length = 0;
    pending.length = 0;
    showPending();
    chat.replaceChildren();
  });
})();
