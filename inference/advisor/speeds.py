"""Measured speeds of one server (a variant on a node): what the simulator charges each step.

A speeds file (JSON), every time in milliseconds:

    {
      "devices_per_server": 1,
      "prefill_ms": {"batch": [1, 4], "tokens": [128, 512, 1024],
                     "ms": [[60, 250, 560], [70, 260, 580]]},
      "decode_step_ms": {"batch": [1, 8, 16], "context": [128, 1024],
                         "ms": [[29, 31], [35, 40], [46, 55]]},
      "handoff_ms": {"tokens": [128, 1024], "ms": [4, 15]},
      "interference": {"tokens": [128, 1024], "factor": [1.0, 1.2]},
      "neighbour": {"factor": 1.4},
      "batching": {"max_num_batched_tokens": 2048, "max_num_seqs": 128,
                   "chunked_prefill": true, "prefill_server_chunked_prefill": false}
    }

- ``prefill_ms``: one engine step that prefills ``tokens`` prompt tokens in all, spread over
  ``batch`` prompts (``batch`` may be left out: then only the tokens count, and ``ms`` is a
  list). ``inference/variant_speed.py``'s ``prefill_ms`` at ``prefill_tokens`` is one point of
  this curve (a batch of one).
- ``decode_step_ms``: one decode step of ``batch`` running requests whose context (prompt plus
  tokens generated so far) averages ``context`` tokens (``context`` may be left out). The
  mean is exact for the attention term, which reads every request's whole KV once a step.
  ``1000 / decode_tps`` of ``variant_speed`` is the one-stream point.
- ``handoff_ms``: moving a prompt's KV from a prefill to a decode server over the plan's
  channel, against prompt tokens.
- ``interference`` (optional, factor 1 everywhere when left out): a step that prefills
  ``tokens`` while it also decodes takes ``factor * (prefill + decode step)``. 1 means the two
  cost what they cost alone (a CPU with no spare compute); above 1 they slow each other
  further (caches, memory bandwidth); below 1 the decode tokens ride along (a GPU's spare
  compute). Measure it as a decode stream's token gap while a prompt of ``tokens`` is prefilled
  on the same server, over the two alone.
- ``neighbour`` (optional, factor 1 when left out): a step that starts while another server
  of the node is in the middle of one takes ``factor`` times its cost. On a machine whose every
  core runs an engine, the servers' API servers, their busy-polling engine processes, the
  router and the clients take their CPU from the engines' steps, and memory bandwidth is
  shared; the other measurements are of one server with the rest of the machine to itself.
  Measure it as one server's decode step while a second server, on another core, decodes a
  batch of its own without pause, over the step alone (non-streamed: see the README for the
  streamed variants tried).
- ``batching``: the servers' scheduler settings; the defaults are vLLM's for a CPU OpenAI
  server (``vllm/engine/arg_utils.py``, 0.32): 2,048 tokens and 128 requests a step, chunked
  prefill on. pdserve's PD prefill servers run without chunked prefill under the
  shared-storage channel (README, "KV channels"), hence ``prefill_server_chunked_prefill``.

Costs between and beyond the measured points: see ``curves.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.advisor.curves import Curve, Grid
from inference.advisor.errors import InputError
from inference.advisor.fields import (
    boolean,
    integer,
    known_keys,
    mapping,
    number,
    numbers,
    read_json,
)

TOP_LEVEL = {"devices_per_server", "prefill_ms", "decode_step_ms", "handoff_ms", "interference",
             "neighbour", "batching"}


@dataclass(frozen=True)
class Batching:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    chunked_prefill: bool = True
    prefill_server_chunked_prefill: bool = False


@dataclass(frozen=True)
class Speeds:
    prefill: Grid  # rows: prompts in the step; columns: the step's prompt tokens
    decode_step: Grid  # rows: running requests; columns: mean context tokens
    handoff: Curve  # prompt tokens
    interference: Curve  # the step's prefill tokens -> factor
    batching: Batching = Batching()
    devices_per_server: int = 1
    neighbour_factor: float = 1.0  # a step beside another server's step costs this much more

    def prefill_ms(self, prompts: int, tokens: int) -> float:
        return self.prefill(prompts, tokens)

    def decode_step_ms(self, batch: int, mean_context: float) -> float:
        return self.decode_step(batch, mean_context)

    def handoff_ms(self, prompt_tokens: int) -> float:
        return self.handoff(prompt_tokens)

    def interference_factor(self, prefill_tokens: int) -> float:
        return self.interference(prefill_tokens)


def _grid(value: Any, where: str, rows_key: str, columns_key: str, optional: str) -> Grid:
    """A grid whose ``optional`` axis may be left out: the cost then does not depend on it
    (one point on that axis) and ``ms`` is a plain list over the other axis."""
    value = mapping(value, where)
    known_keys(value, {rows_key, columns_key, "ms"}, where)
    for key in {rows_key, columns_key} - {optional}:
        if key not in value:
            raise InputError(f"{where}.{key}", "missing")
    if "ms" not in value:
        raise InputError(f"{where}.ms", "missing")
    ms = value["ms"]
    if optional not in value:
        ms = [numbers(ms, f"{where}.ms")]
        ms = ms if optional == rows_key else [[v] for v in ms[0]]
    elif not isinstance(ms, list):
        raise InputError(f"{where}.ms", "expected a list of rows, one per "
                                        f"{rows_key} value")
    else:
        ms = [numbers(row, f"{where}.ms[{i}]") for i, row in enumerate(ms)]
    rows = numbers(value[rows_key], f"{where}.{rows_key}") if rows_key in value else [0.0]
    columns = numbers(value[columns_key], f"{where}.{columns_key}") if columns_key in value else [0.0]
    return Grid.checked(rows, columns, ms, f"{where}.ms")


def _curve(value: Any, where: str, x_key: str, y_key: str) -> Curve:
    value = mapping(value, where)
    known_keys(value, {x_key, y_key}, where)
    for key in (x_key, y_key):
        if key not in value:
            raise InputError(f"{where}.{key}", "missing")
    return Curve.checked(numbers(value[x_key], f"{where}.{x_key}"),
                         numbers(value[y_key], f"{where}.{y_key}"), where)


def _batching(value: Any) -> Batching:
    value = mapping(value, "batching")
    default = Batching()
    known_keys(value, set(default.__dataclass_fields__), "batching")
    return Batching(
        max_num_batched_tokens=integer(value.get("max_num_batched_tokens", default.max_num_batched_tokens),
                                       "batching.max_num_batched_tokens", minimum=1),
        max_num_seqs=integer(value.get("max_num_seqs", default.max_num_seqs),
                             "batching.max_num_seqs", minimum=1),
        chunked_prefill=boolean(value.get("chunked_prefill", default.chunked_prefill),
                                "batching.chunked_prefill"),
        prefill_server_chunked_prefill=boolean(
            value.get("prefill_server_chunked_prefill", default.prefill_server_chunked_prefill),
            "batching.prefill_server_chunked_prefill"))


def _neighbour(value: Any) -> float:
    value = mapping(value, "neighbour")
    known_keys(value, {"factor"}, "neighbour")
    if "factor" not in value:
        raise InputError("neighbour.factor", "missing")
    return number(value["factor"], "neighbour.factor", above=True)


def speeds_from_json(value: Any) -> Speeds:
    value = mapping(value, "speeds")
    known_keys(value, TOP_LEVEL, "")
    for key in ("prefill_ms", "decode_step_ms", "handoff_ms"):
        if key not in value:
            raise InputError(key, "missing")
    prefill = _grid(value["prefill_ms"], "prefill_ms", "batch", "tokens", optional="batch")
    if len(prefill.row_curves[0].xs) < 2:
        # One point would make every prompt cost the same, whatever its length.
        raise InputError("prefill_ms.tokens", "needs at least two prompt lengths")
    interference = (_curve(value["interference"], "interference", "tokens", "factor")
                    if "interference" in value else Curve((0.0,), (1.0,)))
    if any(f <= 0 for f in interference.ys):
        raise InputError("interference.factor", "factors must be above 0")
    return Speeds(
        prefill=prefill,
        decode_step=_grid(value["decode_step_ms"], "decode_step_ms", "batch", "context",
                          optional="context"),
        handoff=_curve(value["handoff_ms"], "handoff_ms", "tokens", "ms"),
        interference=interference,
        batching=_batching(value.get("batching", {})),
        neighbour_factor=_neighbour(value["neighbour"]) if "neighbour" in value else 1.0,
        devices_per_server=integer(value.get("devices_per_server", 1), "devices_per_server",
                                   minimum=1))


def load_speeds(path: Path) -> Speeds:
    return speeds_from_json(read_json(path, "--speeds"))
