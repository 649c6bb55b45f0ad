"""KV hand-off warm-up: one synthetic hand-off per prefill/decode pair before client traffic.

vLLM's NixlConnector connects a decode engine to a prefill engine lazily, on the first request
that hands KV between them: metadata over the prefill's side channel (a 5 s receive timeout),
then UCX. On a loaded machine that first handshake can fail, and the client whose request it was
gets a KV load failure. So, with ``--kv-warmup-tokens N``, the router makes that first hand-off
itself for every pair of ready workers: a prompt of N token ids (more than one KV block, so
blocks really move) prefilled with ``max_tokens`` 1, then decoded from its transfer parameters.

A pair that fails is tried again every ``retry_s``. A worker that goes down comes back as a new
engine, so its pairs are warmed again. The router's ``/health`` is not healthy until at least
one pair is warm, and lists every pair's state.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from inference.router.backends import Backend, Pool
from inference.router.handoff import NIXL_PREFILL_PARAMS
from inference.router.upstream import upstream_message

log = logging.getLogger("pdserve.router.warmup")

# The text the synthetic prompt is made of; any text does, it only has to tokenize.
FILLER = ("Prefill computes the prompt once and hands its KV cache to decode, which then writes "
          "one token per step. ")


@dataclass
class PairState:
    state: str = "pending"  # pending | warm | failed
    error: str = ""
    attempts: int = 0


def warmup_prompt(encode_ids: Sequence[int], tokens: int) -> list[int]:
    """``tokens`` ids cut from the filler's ids, repeated as needed."""
    if not encode_ids:
        raise ValueError("the tokenizer gave no ids for the warm-up text")
    repeats = tokens // len(encode_ids) + 1
    return (list(encode_ids) * repeats)[:tokens]


class PairWarmer:
    def __init__(self, prefill: Pool, decode: Pool, model: str, prompt_ids: list[int],
                 vocab_size: int, retry_s: float = 2.0, call_timeout_s: float = 120.0):
        self.prefill = prefill
        self.decode = decode
        self.model = model
        self.prompt_ids = prompt_ids
        self.vocab_size = vocab_size
        self.retry_s = retry_s
        self.call_timeout_s = call_timeout_s
        self.pairs: dict[tuple[str, str], PairState] = {}
        self._round = 0

    def any_warm(self) -> bool:
        return any(pair.state == "warm" for pair in self.pairs.values())

    def report(self) -> list[dict[str, Any]]:
        return [{"prefill": p, "decode": d, "state": pair.state, "attempts": pair.attempts,
                 "error": pair.error} for (p, d), pair in self.pairs.items()]

    async def run_forever(self) -> None:
        while True:
            try:
                await self.warm_round()
            except Exception:
                # A bug here must not end the warm-up for good, leaving /health at 503.
                log.exception("KV warm-up round failed")
            await asyncio.sleep(self.retry_s)

    async def warm_round(self) -> None:
        """Forget pairs whose worker is gone or down, then warm every ready pair not warm."""
        ready_p, ready_d = self.prefill.ready(), self.decode.ready()
        live = {(p.url, d.url) for p in ready_p for d in ready_d}
        for key in list(self.pairs):
            if key not in live:
                del self.pairs[key]
        for p in ready_p:
            for d in ready_d:
                pair = self.pairs.setdefault((p.url, d.url), PairState())
                if pair.state != "warm":
                    await self._warm(p, d, pair)

    async def _warm(self, prefill: Backend, decode: Backend, pair: PairState) -> None:
        self._round += 1
        pair.attempts += 1
        # A first token of its own per attempt: a prompt decode has cached would be served
        # from its prefix cache, with no hand-off to warm.
        ids = [(self._round * 7919) % self.vocab_size, *self.prompt_ids[1:]]
        try:
            params = await self._call(prefill, {
                "model": self.model, "prompt": ids, "max_tokens": 1, "stream": False,
                "kv_transfer_params": dict(NIXL_PREFILL_PARAMS)})
            kv = params.get("kv_transfer_params")
            if not isinstance(kv, dict) or not kv.get("remote_engine_id"):
                raise WarmupFailed("prefill answered without kv_transfer_params (is it a NIXL "
                                   "kv_producer?)")
            await self._call(decode, {"model": self.model, "prompt": ids, "max_tokens": 1,
                                      "stream": False, "kv_transfer_params": kv})
        except (WarmupFailed, aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            error = str(exc) or type(exc).__name__
            if pair.state != "failed" or pair.error != error:
                log.warning("KV warm-up %s -> %s failed (attempt %d): %s; trying again every "
                            "%g s", prefill.url, decode.url, pair.attempts, error, self.retry_s)
            pair.state, pair.error = "failed", error
            return
        pair.state, pair.error = "warm", ""
        log.info("KV warm-up %s -> %s: hand-off of %d tokens done (attempt %d)", prefill.url,
                 decode.url, len(ids), pair.attempts)

    async def _call(self, backend: Backend, body: dict[str, Any]) -> dict[str, Any]:
        async with backend.client().post(
                "/v1/completions", json=body,
                timeout=aiohttp.ClientTimeout(total=self.call_timeout_s)) as response:
            payload = await response.read()
        if response.status != 200:
            raise WarmupFailed(f"{backend.role} {backend.url} answered {response.status}: "
                               f"{upstream_message(payload)}")
        try:
            data = json.loads(payload)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise WarmupFailed(f"{backend.role} {backend.url} answered 200 without a JSON object")
        return data


class WarmupFailed(Exception):
    pass
