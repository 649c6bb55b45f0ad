"""Request validation and prompt tokenization, done before any worker is touched.

The router tokenizes with the deployment's own tokenizer files so that it can refuse
over-long prompts with a 400, and so that it can confirm decode will see exactly the tokens
prefill computed (decode re-renders chat requests itself).

Tokenizing is the largest part of the router's own cost per request (about 1 us per token), so
a prompt is tokenized only when something needs its ids: the PD hand-off, a policy that routes
by prompt, or a length check that a cheap upper bound cannot settle (see ``Prompt``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("pdserve.router")


class RequestError(Exception):
    """A client error: HTTP status, message, and the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": "invalid_request_error" if self.status < 500 else "server_error",
                "param": self.param,
                "code": self.code,
            }
        }


Encoder = Callable[[str, bool], list[int]]


class Prompt:
    """A request's prompt: token ids given by the client, or text tokenized on first use."""

    __slots__ = ("_encode", "_ids", "add_special_tokens", "text")

    def __init__(self, *, ids: list[int] | None = None, text: str = "",
                 add_special_tokens: bool = False, encode: Encoder | None = None):
        self._ids = ids
        self.text = text
        self.add_special_tokens = add_special_tokens
        self._encode = encode

    @property
    def token_ids(self) -> list[int]:
        if self._ids is None:
            assert self._encode is not None
            self._ids = self._encode(self.text, self.add_special_tokens)
        return self._ids

    @property
    def known_length(self) -> int | None:
        """The number of tokens if they were computed, without computing them."""
        return None if self._ids is None else len(self._ids)


class CharsPerToken:
    """How many characters one token of this deployment's prompts covers, learned from the
    prompts whose exact count became known (vLLM's usage, the PD hand-off): a prompt's tokens
    estimated without tokenizing it. Starts at 4, English's usual figure for BPE vocabularies."""

    def __init__(self, initial: float = 4.0, weight: float = 0.05) -> None:
        self.value = initial
        self.weight = weight

    def estimate(self, text: str) -> int:
        return max(1, math.ceil(len(text) / self.value))

    def observe(self, chars: int, tokens: int) -> None:
        if chars > 0 and tokens > 0:
            # Clamped: one odd prompt (all emoji, all digits) must not swing the estimate far.
            ratio = min(max(chars / tokens, 1.0), 8.0)
            self.value += self.weight * (ratio - self.value)


@dataclass(frozen=True)
class ParsedRequest:
    endpoint: str  # "chat" | "completions"
    body: dict[str, Any]
    stream: bool
    prompt: Prompt
    max_tokens: int | None

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.prompt.token_ids


def _require_text(text: str, param: str) -> str:
    """``text``, if the tokenizer can take it: JSON's \\ud800 escapes give strings with lone
    surrogates, which are not Unicode text and which the tokenizer refuses with an exception."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(400, f"'{param}' holds a lone surrogate (character {exc.start}), "
                                    "which is not Unicode text", param=param) from None
    return text


def _require_type(body: dict[str, Any], name: str, kinds: tuple[type, ...], label: str) -> None:
    if name in body and body[name] is not None and (
        not isinstance(body[name], kinds) or isinstance(body[name], bool) and bool not in kinds
    ):
        raise RequestError(400, f"'{name}' must be {label}", param=name)


class PromptChecker:
    def __init__(self, tokenizer_path: str, served_model_name: str, max_model_len: int):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.encode = _encoder(self.tokenizer)
        self.bound = _token_bound(self.tokenizer)
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len

    def parse(self, endpoint: str, body: Any) -> ParsedRequest:
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        model = body.get("model")
        if model is None:
            raise RequestError(400, "'model' is required", param="model")
        if model != self.served_model_name:
            raise RequestError(
                404,
                f"The model '{model}' does not exist; this endpoint serves "
                f"'{self.served_model_name}'",
                param="model",
                code="model_not_found",
            )
        _require_type(body, "stream", (bool,), "a boolean")
        _require_type(body, "max_tokens", (int,), "an integer")
        _require_type(body, "max_completion_tokens", (int,), "an integer")
        _require_type(body, "n", (int,), "an integer")
        if body.get("n") not in (None, 1):
            raise RequestError(400, "'n' other than 1 is not supported by the PD router", param="n")
        if body.get("best_of") not in (None, 1):
            raise RequestError(400, "'best_of' other than 1 is not supported", param="best_of")
        if endpoint == "chat":
            prompt = self._chat_prompt(body)
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        else:
            prompt = self._completion_prompt(body)
            max_tokens = body.get("max_tokens")
        if max_tokens is not None and max_tokens < 1:
            raise RequestError(400, "'max_tokens' must be at least 1", param="max_tokens")
        self._check_length(prompt, max_tokens, "messages" if endpoint == "chat" else "prompt")
        return ParsedRequest(
            endpoint=endpoint,
            body=body,
            stream=bool(body.get("stream")),
            prompt=prompt,
            max_tokens=max_tokens,
        )

    def _chat_prompt(self, body: dict[str, Any]) -> Prompt:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty list", param="messages")
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                raise RequestError(400, f"'messages[{index}]' must be an object",
                                   param=f"messages[{index}]")
            if not isinstance(message.get("role"), str):
                raise RequestError(400, f"'messages[{index}].role' must be a string",
                                   param=f"messages[{index}].role")
            _require_text(message["role"], f"messages[{index}].role")
            content = message.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise RequestError(400, f"'messages[{index}].content' must be a string or a list",
                                   param=f"messages[{index}].content")
            if isinstance(content, str):
                _require_text(content, f"messages[{index}].content")
        try:
            rendered = self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=body.get("add_generation_prompt", True),
                continue_final_message=body.get("continue_final_message", False),
                tokenize=False,
                **(body.get("chat_template_kwargs") or {}),
            )
        except Exception as exc:  # jinja raises many kinds; the client gets the reason
            raise RequestError(400, f"cannot render 'messages' with the chat template: {exc}",
                               param="messages") from exc
        # What apply_chat_template(tokenize=True) does: the template itself places the special
        # tokens, so none are added. Content parts and template arguments may hold surrogates too.
        return Prompt(text=_require_text(rendered, "messages"), add_special_tokens=False,
                      encode=self.encode)

    def _completion_prompt(self, body: dict[str, Any]) -> Prompt:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return Prompt(text=_require_text(prompt, "prompt"), add_special_tokens=True,
                          encode=self.encode)
        if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return Prompt(ids=list(prompt))
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return Prompt(text=_require_text(prompt[0], "prompt[0]"), add_special_tokens=True,
                          encode=self.encode)
        raise RequestError(
            400, "'prompt' must be a string or a list of token ids (one prompt per request)",
            param="prompt",
        )

    def _check_length(self, prompt: Prompt, max_tokens: int | None, prompt_param: str) -> None:
        if prompt.known_length is None and self.bound is not None:
            most = self.bound(prompt.text, prompt.add_special_tokens)
            if most < self.max_model_len and most + (max_tokens or 0) <= self.max_model_len:
                return  # fits even if every byte were a token: no need to tokenize to know
        prompt_tokens = len(prompt.token_ids)
        if prompt_tokens >= self.max_model_len:
            raise RequestError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens; the "
                f"prompt has {prompt_tokens} tokens",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if max_tokens is not None and prompt_tokens + max_tokens > self.max_model_len:
            raise RequestError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens; the "
                f"prompt has {prompt_tokens} tokens and max_tokens asks for {max_tokens} more",
                param="max_tokens",
                code="context_length_exceeded",
            )


def _encoder(tokenizer: Any) -> Encoder:
    """``encode(text, add_special_tokens)`` with the tokenizer's Rust core called directly.

    Runs once per request: transformers' ``__call__`` wraps the same Rust call in ~100 us of
    Python (a batch of one, a BatchEncoding, checks), and its batch call may hand a single text
    to a thread pool. The direct call is used only if it gives transformers' ids on a sample
    (special tokens, spaces, non-ASCII); a tokenizer that differs keeps the transformers path.
    """

    def through_transformers(text: str, add_special_tokens: bool) -> list[int]:
        return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    backend = getattr(tokenizer, "backend_tokenizer", None)
    # transformers switches truncation and padding off for each call; the direct call cannot.
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return through_transformers

    def direct(text: str, add_special_tokens: bool) -> list[int]:
        return backend.encode(text, add_special_tokens=add_special_tokens).ids

    specials = " ".join(str(token) for token in tokenizer.all_special_tokens)
    samples = ["Hello, world!", "  two  spaces, a tab\tand a newline\n", "Ünïcödé – 字 🙂",
               f"{specials} between specials {specials}"]
    for text in samples:
        for add_special_tokens in (True, False):
            if direct(text, add_special_tokens) != through_transformers(text, add_special_tokens):
                log.warning("tokenizer %s: direct Rust encoding differs from transformers'; "
                            "using the slower transformers path", type(tokenizer).__name__)
                return through_transformers
    return direct


# Pre-tokenizers that only cut the text into pieces (ByteLevel also maps each byte to one
# symbol), never making it longer.
_SPLITTING_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits"}


def _token_bound(tokenizer: Any) -> Callable[[str, bool], int] | None:
    """``bound(text, add_special_tokens)``: at most this many tokens, without tokenizing; None
    for tokenizers where no such cheap bound is sure.

    It is sure for byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM): without a normalizer the text
    is cut into pieces and each byte becomes one symbol, and every token merges one symbol or
    more, so a text has at most as many tokens as UTF-8 bytes; plus a prefix space if the
    pre-tokenizer adds one, plus the special tokens the post-processor adds.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = {step.get("type") for step in steps}
    if (spec.get("normalizer") is not None or (spec.get("model") or {}).get("type") != "BPE"
            or "ByteLevel" not in kinds or not kinds <= _SPLITTING_PRE_TOKENIZERS):
        return None
    prefix = int(any(step.get("add_prefix_space") for step in steps))
    processor = backend.post_processor
    specials = processor.num_special_tokens_to_add(False) if processor is not None else 0

    def bound(text: str, add_special_tokens: bool) -> int:
        return len(text.encode("utf-8", "surrogatepass")) + prefix + (specials if add_special_tokens else 0)

    return bound
