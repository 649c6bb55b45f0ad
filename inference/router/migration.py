"""Request migration: a stream whose worker fails after some of its answer reached the client
goes on on another worker (NVIDIA Dynamo's request migration).

The router asks the worker for the answer's token ids (vLLM's ``return_token_ids``) and keeps,
per stream, the prompt's token ids and the ids of every token it has passed on. When the
worker fails, another one gets the prompt plus those tokens as a token-id prompt on
``/v1/completions``, with ``max_tokens`` reduced by what was sent; its events are rewritten to
look like the rest of the stream (the same ``id``, ``created`` and ``model``, a chat chunk for
a chat stream, usage counting the whole answer). A greedy answer equals an uninterrupted one:
the next token depends only on the tokens before it. A sampled answer (``temperature`` > 0,
with or without ``seed``) goes on with the same distribution, not with the same draws.

What cannot go on is listed in ``why_not_continuable``: its stream ends with an SSE error
event, as before.
"""

from __future__ import annotations

import json
from typing import Any

from inference.router.prompts import ParsedRequest

# Most worker failures a request may go through before its answer ends (each on another worker).
MAX_MIGRATIONS = 3

# What a continuation carries over of the client's body: settings that apply to every token
# the same way on both endpoints. Everything else is either rebuilt (prompt, lengths, stream)
# or was refused by why_not_continuable.
CARRIED = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
           "include_stop_str_in_output", "stop_token_ids", "ignore_eos", "presence_penalty",
           "frequency_penalty", "repetition_penalty", "length_penalty", "logit_bias",
           "allowed_token_ids", "bad_words", "skip_special_tokens",
           "spaces_between_special_tokens", "user", "priority", "cache_salt", "vllm_xargs")
# Delta fields a chat chunk may carry that a plain token continuation cannot reproduce:
# the worker's tool-call or reasoning parser keeps state across the whole answer.
PARSED_DELTAS = ("tool_calls", "reasoning", "reasoning_content", "function_call")


def why_not_continuable(parsed: ParsedRequest) -> str | None:
    """Why a stream cut mid-way cannot go on on another worker (None: it can). Each reason is
    also the ``reason`` label of ``pdserve_router_migrations_refused_total``."""
    body = parsed.body
    if not parsed.stream:
        return "not_streamed"  # never cut mid-way: nothing reached the client before the end
    if parsed.sequences > 1:
        # n > 1, best_of > 1, a batch of prompts: interleaved choices, each its own state.
        return "several_sequences"
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") or \
            body.get("prompt_logprobs") is not None:
        # The top alternatives of the cut position and text offsets would be the new worker's.
        return "logprobs"
    if parsed.images:
        # A continuation is a token-id prompt: the image's placeholder ids would reach the
        # new worker without the pixels behind them, and its answer would be of another prompt.
        return "images"
    if body.get("echo") or body.get("continue_final_message"):
        return "echo"
    response_format = body.get("response_format")
    if (isinstance(response_format, dict) and response_format.get("type") not in (None, "text")) \
            or any(body.get(key) is not None for key in (
                "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                "guided_grammar")):
        # The grammar's state at the cut is the failed worker's; a new one starts it afresh.
        return "structured_output"
    if body.get("tools") and body.get("tool_choice") != "none":
        # vLLM parses tool calls out of the whole answer (and forces them with a grammar).
        return "tools"
    if body.get("stop") and not body.get("include_stop_str_in_output"):
        # vLLM holds back the last characters of a stream that might begin a stop string:
        # the text of tokens already passed on, which a new worker would never send.
        return "stop_strings"
    return None


def _frame(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


# vLLM's own style (pydantic's JSON): no spaces, UTF-8 as is. One encoder for every event:
# json.dumps with options builds a new one per call (hot path: per streamed token).
_EVENT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _dump(event: dict[str, Any]) -> bytes:
    return _EVENT_JSON.encode(event).encode()


class StreamRelay:
    """The events of one streamed answer as they go to the client, across workers.

    ``feed`` takes bytes as the current worker sends them and returns the complete events to
    pass on; it records the answer's identity and token ids, and rewrites a continuation's
    events. ``blocked`` says why the stream could not go on, if it could not."""

    def __init__(self, parsed: ParsedRequest, blocked: str | None):
        self.endpoint = parsed.endpoint
        self.blocked = blocked
        # The client asked for the token ids itself: they stay in its events.
        self.keep_ids = bool(parsed.body.get("return_token_ids"))
        self.buffer = b""
        self.events_sent = 0
        self.identity: dict[str, Any] = {}
        self.prompt_ids: list[int] | None = None
        self.sent_ids: list[int] = []
        # Set from the first continuation on: events are rewritten to continue the stream.
        self.continuing = False
        # The worker now answering runs /v1/completions (a chat stream's continuation).
        self.as_completion = False
        self.finished = False  # a finish_reason was passed on
        self.done = False  # [DONE] was passed on

    # ---- the events ---------------------------------------------------------------------
    def feed(self, chunk: bytes) -> bytes:
        """The complete events in what has arrived so far, as the client is to see them."""
        # hot path: runs once per chunk read from the worker
        self.buffer += chunk
        if b"\n\n" not in self.buffer:
            return b""
        *events, self.buffer = self.buffer.split(b"\n\n")
        out = [self._event(event) for event in events if event]
        return b"".join(out)

    def _event(self, event: bytes) -> bytes:
        # hot path: runs once per streamed token
        if not event.startswith(b"data: "):
            return event + b"\n\n"  # a comment or another field: nothing to track
        data = event[6:]
        if data == b"[DONE]":
            self.done = True
            return _frame(data)
        try:
            obj = json.loads(data)
        except ValueError:
            self.blocked = self.blocked or "unreadable_event"
            return _frame(data)
        if not isinstance(obj, dict) or "error" in obj:
            # vLLM's own error event: passed on; the stream ends after it.
            self.blocked = self.blocked or "worker_error_event"
            return _frame(data)
        changed = self._track(obj)
        if self.continuing:
            rewritten = self._continued(obj)
            if rewritten is None:
                return b""
            obj, changed = rewritten, True
        self.events_sent += 1
        return _frame(_dump(obj) if changed else data)

    def _track(self, obj: dict[str, Any]) -> bool:
        """Record what this event tells (identity, token ids, the end); strip the token ids
        the client did not ask for. Returns whether the event changed."""
        changed = False
        if not self.identity:
            self.identity = {key: obj.get(key) for key in ("id", "created", "model")}
        choices = obj.get("choices") or []
        if self.prompt_ids is None:
            ids = obj.get("prompt_token_ids")
            if ids is None and choices:
                ids = choices[0].get("prompt_token_ids")
            if isinstance(ids, list):
                self.prompt_ids = list(ids)
        if not self.keep_ids and "prompt_token_ids" in obj:
            del obj["prompt_token_ids"]
            changed = True
        for choice in choices:
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                self.sent_ids.extend(ids)
            elif self._carries_tokens(choice):
                # A worker that does not return token ids (or hides them): no continuation.
                self.blocked = self.blocked or "no_token_ids"
            if not self.keep_ids:
                for key in ("token_ids", "prompt_token_ids"):
                    if key in choice:
                        del choice[key]
                        changed = True
            delta = choice.get("delta")
            if isinstance(delta, dict) and any(delta.get(key) for key in PARSED_DELTAS):
                self.blocked = self.blocked or "parsed_output"
            if choice.get("finish_reason") is not None:
                self.finished = True
        return changed

    @staticmethod
    def _carries_tokens(choice: dict[str, Any]) -> bool:
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        return bool(text)

    def _continued(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """A continuation's event made to look like the rest of the stream (None: drop it)."""
        out = {**obj, **{k: v for k, v in self.identity.items() if v is not None}}
        choices = obj.get("choices") or []
        if self.endpoint == "chat":
            out["object"] = "chat.completion.chunk"
            new_choices = []
            for choice in choices:
                if self.as_completion:
                    new = {"index": choice.get("index", 0),
                           "delta": {"content": choice.get("text") or ""},
                           "logprobs": None, "finish_reason": choice.get("finish_reason")}
                    if choice.get("finish_reason") is not None:
                        new["stop_reason"] = choice.get("stop_reason")
                    if "token_ids" in choice:
                        new["token_ids"] = choice["token_ids"]
                else:
                    new = dict(choice)
                    delta = dict(new.get("delta") or {})
                    delta.pop("role", None)  # the client had the role in the first event
                    new["delta"] = delta
                if (not new["delta"].get("content") and new.get("finish_reason") is None
                        and not new.get("token_ids")):
                    continue  # nothing to say: the role announcement, an empty step
                new_choices.append(new)
            out["choices"] = new_choices
        if "usage" in obj and isinstance(obj["usage"], dict) and self.prompt_ids is not None:
            out["usage"] = self.usage(obj["usage"])
        if not out.get("choices") and "usage" not in out:
            return None
        return out

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The whole answer's usage: the client's prompt, every token it was sent."""
        prompt = len(self.prompt_ids or ())
        completion = len(self.sent_ids)
        return {**usage, "prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    # ---- going on elsewhere ---------------------------------------------------------------
    def why_not_now(self) -> str | None:
        """Why this stream cannot go on now (None: it can)."""
        if self.blocked:
            return self.blocked
        if self.prompt_ids is None:
            return "no_token_ids"
        return None

    def continuation(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The body of the call that goes on from here (to /v1/completions), made from the
        client's ``body``; None when the answer already has all its tokens."""
        assert self.prompt_ids is not None
        sent = len(self.sent_ids)
        limit = body.get("max_completion_tokens") if self.endpoint == "chat" else None
        if limit is None:
            limit = body.get("max_tokens")
        out = {key: body[key] for key in CARRIED if key in body}
        out.update(prompt=[*self.prompt_ids, *self.sent_ids], stream=True,
                   return_token_ids=True)
        if isinstance(limit, int):
            if limit - sent <= 0:
                return None
            out["max_tokens"] = limit - sent
        if isinstance(body.get("min_tokens"), int):
            out["min_tokens"] = max(0, body["min_tokens"] - sent)
        options = body.get("stream_options")
        if isinstance(options, dict):
            out["stream_options"] = {k: v for k, v in options.items()
                                     if k in ("include_usage", "continuous_usage_stats")}
        return out

    def continue_from(self) -> None:
        """The next events come from a continuation (on /v1/completions)."""
        self.continuing = True
        self.as_completion = True
        self.buffer = b""

    def tail(self, wants_usage: bool) -> bytes:
        """What ends a stream whose last events were lost with its worker after its last token
        had been passed on: the usage (if asked) and [DONE]."""
        out = b""
        if wants_usage and self.prompt_ids is not None:
            event = {**self.identity, "object": "chat.completion.chunk"
                     if self.endpoint == "chat" else "text_completion",
                     "choices": [], "usage": self.usage({})}
            out += _frame(_dump(event))
        return out + _frame(b"[DONE]")
