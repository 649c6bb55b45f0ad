"""The load: when requests arrive and how long their prompts and answers are.

A load profile (JSON) is one or more streams, merged:

    {"streams": [
      {"name": "chat", "rate_per_s": 0.75, "requests": 60,
       "prompt_tokens": 64, "output_tokens": 128},
      {"name": "documents", "rate_per_s": 0.4, "requests": 30, "burstiness": 1.0,
       "prompt_tokens": [900, 1024, 1100], "output_tokens": [16, 24]},
      {"name": "replayed", "arrivals_s": [0.0, 0.8, 1.1],
       "prompt_tokens": [300], "output_tokens": 40}
    ]}

- arrivals: ``rate_per_s`` with ``requests`` draws gaps as vLLM's benchmark client does:
  Gamma(shape = burstiness, scale = 1 / (rate * burstiness)), burstiness 1 (the default) being
  Poisson, the first request at 0; or ``arrivals_s``, a recorded trace in seconds.
- lengths: a whole number is typed in and fixed; a list is empirical samples, drawn with
  replacement (so each seed is also a bootstrap of them).

Time starts at the earliest arrival of the merged load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.advisor.errors import InputError
from inference.advisor.fields import integer, known_keys, mapping, number, numbers, read_json

STREAM_KEYS = {"name", "rate_per_s", "requests", "burstiness", "arrivals_s", "prompt_tokens",
               "output_tokens"}


@dataclass(frozen=True)
class Lengths:
    samples: tuple[int, ...]  # one value: fixed

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if len(self.samples) == 1:
            return np.full(count, self.samples[0], dtype=np.int64)
        return rng.choice(np.asarray(self.samples, dtype=np.int64), size=count, replace=True)


@dataclass(frozen=True)
class Stream:
    name: str
    prompt_tokens: Lengths
    output_tokens: Lengths
    rate_per_s: float | None = None
    requests: int = 0
    burstiness: float = 1.0
    arrivals_s: tuple[float, ...] | None = None

    def arrivals(self, rng: np.random.Generator) -> np.ndarray:
        if self.arrivals_s is not None:
            return np.asarray(self.arrivals_s)
        assert self.rate_per_s is not None  # stream_from_json sets one of the two
        gaps = rng.gamma(self.burstiness, 1.0 / (self.rate_per_s * self.burstiness),
                         size=self.requests - 1)
        return np.concatenate(([0.0], np.cumsum(gaps)))


@dataclass(frozen=True)
class Workload:
    """One drawn load, sorted by arrival."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)


@dataclass(frozen=True)
class LoadProfile:
    streams: tuple[Stream, ...]

    def draw(self, seed: int) -> Workload:
        """The same seed gives the same workload, so every candidate is judged on it."""
        rng = np.random.default_rng(seed)
        parts = []
        for stream in self.streams:
            arrivals = stream.arrivals(rng)
            parts.append((arrivals, stream.prompt_tokens.draw(rng, len(arrivals)),
                          stream.output_tokens.draw(rng, len(arrivals))))
        arrival, prompt, output = (np.concatenate(column) for column in zip(*parts, strict=True))
        # A stable sort keeps streams' order at equal arrival times, so results stay exact.
        order = np.argsort(arrival, kind="stable")
        return Workload(arrival[order] - arrival.min(), prompt[order], output[order])


def _lengths(value: Any, where: str) -> Lengths:
    if isinstance(value, list):
        if not value:
            raise InputError(where, "expected a whole number or a non-empty list of them")
        return Lengths(tuple(integer(v, f"{where}[{i}]", minimum=1) for i, v in enumerate(value)))
    return Lengths((integer(value, where, minimum=1),))


def stream_from_json(value: Any, where: str) -> Stream:
    value = mapping(value, where)
    known_keys(value, STREAM_KEYS, where)
    for key in ("prompt_tokens", "output_tokens"):
        if key not in value:
            raise InputError(f"{where}.{key}", "missing")
    common = {"name": str(value.get("name", where)),
              "prompt_tokens": _lengths(value["prompt_tokens"], f"{where}.prompt_tokens"),
              "output_tokens": _lengths(value["output_tokens"], f"{where}.output_tokens")}
    if ("arrivals_s" in value) == ("rate_per_s" in value):
        raise InputError(where, "give either rate_per_s (with requests) or arrivals_s")
    if "arrivals_s" in value:
        for key in ("requests", "burstiness"):
            if key in value:
                raise InputError(f"{where}.{key}", "only with rate_per_s")
        return Stream(arrivals_s=tuple(numbers(value["arrivals_s"], f"{where}.arrivals_s")), **common)
    if "requests" not in value:
        raise InputError(f"{where}.requests", "missing (how many requests to draw at rate_per_s)")
    return Stream(rate_per_s=number(value["rate_per_s"], f"{where}.rate_per_s", above=True),
                  requests=integer(value["requests"], f"{where}.requests", minimum=1),
                  burstiness=number(value.get("burstiness", 1.0), f"{where}.burstiness", above=True),
                  **common)


def profile_from_json(value: Any) -> LoadProfile:
    value = mapping(value, "load")
    known_keys(value, {"streams"}, "")
    streams = value.get("streams")
    if not isinstance(streams, list) or not streams:
        raise InputError("streams", "expected a non-empty list of streams")
    return LoadProfile(tuple(stream_from_json(s, f"streams[{i}]") for i, s in enumerate(streams)))


def load_profile(path: Path) -> LoadProfile:
    return profile_from_json(read_json(path, "--load"))
