"""How vLLM 0.32 reads a chat request's messages, as far as the router reproduces it: which
messages it renders itself (plain roles, text or text parts), which a worker must render, and
whether a template takes content as one text or as parts (vLLM's "string" and "openai" content
formats)."""

from __future__ import annotations

from typing import Any

# Request fields that change what the chat template renders in ways the router does not
# reproduce (vLLM adds tools to the template's context, and formats documents and media).
WORKER_RENDERED_FIELDS = ("tools", "documents", "mm_processor_kwargs", "chat_template")
PLAIN_ROLES = frozenset({"system", "user", "assistant"})


def well_formed(message: Any) -> bool:
    """What vLLM's request model requires of every message: a role, and content that is text,
    a list of parts, or absent."""
    return (isinstance(message, dict) and isinstance(message.get("role"), str)
            and (message.get("content") is None or isinstance(message["content"], (str, list))))


def plain_message(message: dict[str, Any]) -> bool:
    """A message the router renders as vLLM does: a plain role, and text or text parts only."""
    if set(message) - {"role", "content"} or message["role"] not in PLAIN_ROLES:
        return False
    content = message.get("content")
    if isinstance(content, str):
        return True
    return isinstance(content, list) and bool(content) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        and set(part) == {"type", "text"} for part in content)


def message_text(messages: list[dict[str, Any]]) -> str:
    """The text of messages, for estimates (rate limits) before a worker has rendered them."""
    pieces: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            pieces.append(content)
        elif isinstance(content, list):
            pieces += [part["text"] for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str)]
    return "\n".join(pieces).encode("utf-8", "replace").decode("utf-8")


def content_format(tokenizer: Any, chat_template: str | None) -> str:
    """"openai" if the chat template loops over a message's content parts, else "string" (it
    prints content as one text), as vLLM detects it. Found by rendering one message of a part:
    a template that prints content as a string shows the part's dict itself."""
    probe = "pdserve-content-probe"
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "text", "text": probe}]}],
            chat_template=chat_template, tokenize=False, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template that cannot loop over parts takes strings
        return "string"
    return "openai" if probe in rendered and "'type'" not in rendered else "string"
