"""Request validation and prompt tokenization, done before any worker is touched.

The router tokenizes with the deployment's own tokenizer files so that it can refuse
over-long prompts with a 400, and so that it can confirm decode will see exactly the tokens
prefill computed (decode re-renders chat requests itself).

Tokenizing is the largest part of the router's own cost per request (about 1 us per token), so
a prompt is tokenized only when something needs its ids: the PD hand-off, a policy that routes
by prompt, or a length check that a cheap upper bound cannot settle (see ``Prompt``). ``parse``
never tokenizes: the exact length check (``check_length``) comes after the key's cheap limits,
and the router tokenizes a long prompt off its event loop first (see tokenizing.py).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inference.router.chat_messages import (
    WORKER_RENDERED_FIELDS,
    content_format,
    message_text,
    plain_message,
    well_formed,
)
from inference.router.errors import RequestError

log = logging.getLogger("pdserve.router")


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
    # Why the request cannot be split into a prefill and a decode call (None: it can). Such a
    # request is sent whole to one worker, which computes its own prompt.
    whole: str | None = None
    # A chat request the router cannot render exactly as vLLM does (tools, tool messages,
    # non-text parts): its tokens come from a worker's /tokenize (see RequestPath._render_on_worker).
    render_on_worker: bool = False
    # The field to name if the prompt is too long, when only its exact token count can tell
    # (``PromptChecker.check_length``); None: it surely fits, or its worker checks it.
    length_unsettled: str | None = None
    # How many answers the request asks for: its prompts (a batch) times max(n, best_of).
    sequences: int = 1
    # Where the request's X-Pdserve-Placement header says its prompt is prefilled (None: the
    # router's policy chooses; see asked_placement.py).
    placement: str | None = None
    # Image parts (checked and inlined by media.py before any worker is called).
    images: int = 0

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


# The strings pydantic's lax mode (vLLM's request models) reads as booleans.
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _lax_bool(value: Any) -> bool | None:
    """``value`` as vLLM's request validation reads a boolean field; None if it would refuse."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    return None


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def _whole_request_reason(endpoint: str, body: dict[str, Any]) -> str | None:
    """Why the request must run whole on one worker although its prompt is known."""
    n, best_of = body.get("n"), body.get("best_of")
    if (isinstance(n, int) and n > 1) or (isinstance(best_of, int) and best_of > 1):
        # Several sequences of one prompt: each would load the one hand-off's KV.
        return "several_sequences"
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            # The prefill call asks for one token whatever the client asked: decode alone
            # says what it makes of this value.
            return "checked_by_worker"
    if body.get("prompt_logprobs") is not None or (
            endpoint == "completions" and body.get("echo") and body.get("logprobs") is not None):
        # The prompt's own logprobs come from computing it, which a KV hand-off skips.
        return "prompt_logprobs"
    return None


def _sequences(endpoint: str, body: dict[str, Any]) -> int:
    """How many answers a request asks for, each up to its max_tokens: max(n, best_of) per
    prompt, and a completions batch has one prompt per entry. Values vLLM would refuse count 1:
    vLLM answers them with a 400 that generates nothing."""
    copies = max([1] + [value for value in (body.get("n"), body.get("best_of"))
                        if isinstance(value, int) and not isinstance(value, bool)])
    prompt = body.get("prompt") if endpoint == "completions" else None
    prompts = len(prompt) if isinstance(prompt, list) and prompt and all(
        isinstance(p, (str, list)) for p in prompt) else 1
    return copies * prompts


class PromptChecker:
    def __init__(self, tokenizer_path: str, served_model_name: str, max_model_len: int,
                 chat_template: str | None = None):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.chat_template = chat_template
        self.content_format = content_format(self.tokenizer, chat_template)
        self.encode = _encoder(self.tokenizer)
        self.bound = _token_bound(self.tokenizer)
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len

    def parse(self, endpoint: str, body: Any) -> ParsedRequest:
        if not isinstance(body, dict):
            # vLLM's validation refuses it in its own words; the router passes it on whole.
            return ParsedRequest(endpoint=endpoint, body={}, stream=False, prompt=Prompt(ids=[]),
                                 max_tokens=None, whole="unparsed_body")
        model = body.get("model")
        # No model: vLLM serves its own, as the router does.
        if model is not None and model != self.served_model_name:
            raise RequestError(
                404,
                f"The model '{model}' does not exist; this endpoint serves "
                f"'{self.served_model_name}'",
                param="model",
                code="model_not_found",
            )
        stream = _lax_bool(body.get("stream", False))
        if stream is None:
            raise RequestError(400, "'stream' must be a boolean", param="stream")
        if endpoint == "chat":
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
            prompt, whole, on_worker = self._chat_prompt(body)
        else:
            max_tokens = body.get("max_tokens")
            prompt, whole = self._completion_prompt(body)
            on_worker = False
        # What a worker answers for itself, with its own status and message, is left to it:
        # the router refuses nothing vLLM would take (n, best_of, max_tokens=0 and the rest).
        whole = whole or _whole_request_reason(endpoint, body)
        unsettled = None
        if whole is None and not on_worker:
            param = "messages" if endpoint == "chat" else "prompt"
            if not self._surely_fits(prompt, max_tokens if isinstance(max_tokens, int) else None,
                                     param):
                unsettled = param
        return ParsedRequest(
            endpoint=endpoint,
            body=body,
            stream=stream,
            prompt=prompt,
            max_tokens=max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None,
            whole=whole,
            render_on_worker=on_worker,
            length_unsettled=unsettled,
            sequences=_sequences(endpoint, body),
        )

    def check_length(self, parsed: ParsedRequest) -> None:
        """The exact length check that ``parse`` left (``length_unsettled``). Tokenizes the
        prompt if its ids are not known yet: the router computes them off its loop first."""
        if parsed.length_unsettled is not None:
            # A request with a max_tokens its worker must judge goes whole (see
            # _whole_request_reason), so here it is a positive integer or absent.
            self._check_length(parsed.prompt, parsed.max_tokens, parsed.length_unsettled)

    def check_rendered_length(self, parsed: ParsedRequest) -> None:
        """The length check of a prompt a worker rendered (see ParsedRequest.render_on_worker)."""
        self._check_length(parsed.prompt, parsed.max_tokens, "messages")

    def _chat_prompt(self, body: dict[str, Any]) -> tuple[Prompt, str | None, bool]:
        """The rendered prompt, why the request goes whole to one worker (None: it need not),
        and whether a worker must render it (the router's rendering would not be vLLM's)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                well_formed(m) for m in messages):
            # vLLM's own validation answers it, with vLLM's message.
            return Prompt(ids=[]), "unparsed_messages", False
        for index, message in enumerate(messages):
            _require_text(message["role"], f"messages[{index}].role")
            content = message.get("content")
            if isinstance(content, str):
                _require_text(content, f"messages[{index}].content")
            for number, part in enumerate(content if isinstance(content, list) else ()):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    _require_text(part["text"], f"messages[{index}].content[{number}].text")
        if any(body.get(key) is not None for key in WORKER_RENDERED_FIELDS) or not all(
                plain_message(m) for m in messages):
            return Prompt(text=message_text(messages), encode=self.encode), None, True
        conversation = [{"role": m["role"], "content": self._content(m["content"])}
                        for m in messages]
        try:
            rendered = self.tokenizer.apply_chat_template(
                conversation,
                chat_template=self.chat_template,
                add_generation_prompt=body.get("add_generation_prompt", True),
                continue_final_message=body.get("continue_final_message", False),
                tokenize=False,
                **(body.get("chat_template_kwargs") or {}),
            )
        except Exception:  # jinja raises many kinds: vLLM renders it, or refuses it, itself
            return Prompt(text=message_text(messages), encode=self.encode), None, True
        # What vLLM does: the template itself places the special tokens, so none are added.
        return Prompt(text=_require_text(rendered, "messages"), add_special_tokens=False,
                      encode=self.encode), None, False

    def _content(self, content: str | list[dict[str, Any]] | None) -> Any:
        """A message's content as vLLM hands it to the template: text parts joined by newlines
        for templates that print content as a string, the parts themselves for templates that
        loop over them (vLLM's "string" and "openai" content formats)."""
        if not isinstance(content, list):
            return content
        texts = [part["text"] for part in content]
        if self.content_format == "openai":
            return [{"type": "text", "text": text} for text in texts]
        return "\n".join(texts)

    def _completion_prompt(self, body: dict[str, Any]) -> tuple[Prompt, str | None]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return Prompt(text=_require_text(prompt, "prompt"), add_special_tokens=True,
                          encode=self.encode), None
        if _token_ids(prompt):
            return Prompt(ids=list(prompt)), None
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return Prompt(text=_require_text(prompt[0], "prompt[0]"), add_special_tokens=True,
                          encode=self.encode), None
        if isinstance(prompt, list) and len(prompt) == 1 and _token_ids(prompt[0]):
            return Prompt(ids=list(prompt[0])), None
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            # A batch: one choice per prompt. Its tokens are counted as one text, for limits.
            return Prompt(text=_require_text("\n".join(prompt), "prompt"), add_special_tokens=True,
                          encode=self.encode), "batched_prompt"
        if isinstance(prompt, list) and prompt and all(_token_ids(p) for p in prompt):
            return Prompt(ids=[t for ids in prompt for t in ids]), "batched_prompt"
        # Embeddings, empty or mixed lists: what vLLM does with them is vLLM's to say.
        return Prompt(ids=[]), "unparsed_prompt"

    def _surely_fits(self, prompt: Prompt, max_tokens: int | None, param: str) -> bool:
        """Whether the prompt fits even if every byte were a token: no need to tokenize to
        know. A prompt of token ids is checked exactly (raising RequestError): it costs nothing."""
        if prompt.known_length is not None:
            self._check_length(prompt, max_tokens, param)
            return True
        if self.bound is None:
            return False
        most = self.bound(prompt.text, prompt.add_special_tokens)
        return most < self.max_model_len and most + (max_tokens or 0) <= self.max_model_len

    def _check_length(self, prompt: Prompt, max_tokens: int | None, prompt_param: str) -> None:
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

    # The batch call of one text releases the GIL while the Rust core works (``encode`` holds it:
    # a 4 MB prompt would freeze every thread for seconds), so the router can tokenize in a
    # thread while its loop serves (tokenizing.py); ``_fast`` leaves out the offsets, which
    # makes it faster than ``encode`` even for a short text (~260 against ~420 us for 100 words).
    batch = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)

    def direct(text: str, add_special_tokens: bool) -> list[int]:
        if batch is None:
            return backend.encode(text, add_special_tokens=add_special_tokens).ids
        return batch([text], add_special_tokens=add_special_tokens)[0].ids

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
