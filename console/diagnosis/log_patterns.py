"""The log lines the symptoms are recognised by: what vLLM 0.32, pdserve's router, its KV
connector and the supervisor actually write (the sources are named beside each pattern).

Each pattern has a ``needle``, a plain substring the database filters stored lines by (any
case), and a regular expression that decides; lines are classified here, purely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Pattern:
    kind: str
    needle: str
    regex: re.Pattern[str]


def _p(kind: str, needle: str, regex: str) -> Pattern:
    return Pattern(kind, needle, re.compile(regex, re.IGNORECASE))


# Kinds, by symptom family.
OOM_KV = "oom_kv"  # the KV cache cannot hold one request at max_model_len
OOM_NO_CACHE = "oom_no_cache"  # nothing left for the KV cache after the weights
OOM = "oom"  # an allocation failed (CUDA, the host)
OOM_KILLED = "oom_killed"  # an engine subprocess killed by SIGKILL: the kernel's OOM killer
CONTEXT_TOO_LONG = "context_too_long"  # max_model_len beyond what the model allows
PORT_IN_USE = "port_in_use"
OUT_OF_ROTATION = "out_of_rotation"
CONNECT_FAILED = "connect_failed"
KV_LOAD_FAILED = "kv_load_failed"
KV_TRANSFER_FAILED = "kv_transfer_failed"
KV_HANDSHAKE = "kv_handshake"
KV_EXPIRED = "kv_expired"
KV_NOT_SAVED = "kv_not_saved"
KV_HANDOFF_FAILED = "kv_handoff_failed"
ENGINE_DEAD = "engine_dead"
MID_STREAM = "mid_stream"
HEALTH_FAILING = "health_failing"

PATTERNS: tuple[Pattern, ...] = (
    # vllm/v1/core/kv_cache_utils.py, _check_enough_kv_cache_memory
    _p(OOM_KV, "KV cache is needed", r"KV\s+cache is needed, which is larger than the available"),
    _p(OOM_NO_CACHE, "No available memory for the cache blocks",
       r"No available memory for the cache blocks"),
    # torch on CUDA; the host's allocator (ENOMEM) and Python's MemoryError on CPU
    _p(OOM, "out of memory", r"(CUDA|torch\.)?\s*out of memory|OutOfMemoryError"),
    _p(OOM, "Cannot allocate memory", r"Cannot allocate memory"),
    _p(OOM, "MemoryError", r"\bMemoryError\b"),
    # vllm/v1/executor/multiproc_executor.py and v1/utils.py: the engine's own subprocess
    # (which holds the weights and the KV cache) ended by SIGKILL while the server lived
    _p(OOM_KILLED, "exit code", r"died unexpectedly \(exit code: -9\)|died with exit code -9\b"),
    # vllm/config/model.py: a max_model_len above the model's derived one
    _p(CONTEXT_TOO_LONG, "derived max_model_len",
       r"max_model_len \(\d+\) is greater\s+than the derived max_model_len"),
    # uvicorn / asyncio binding a port another process holds
    _p(PORT_IN_USE, "address already in use", r"\[Errno 98\]|address already in use"),
    # inference/router/backends.py: a backend leaves the router's rotation
    _p(OUT_OF_ROTATION, "out of rotation", r"\b(prefill|decode|colocated) \S+ out of rotation"),
    # aiohttp's ClientConnectorError, as the router logs a failed call
    _p(CONNECT_FAILED, "Cannot connect to host", r"Cannot connect to host"),
    # vllm/v1/core/sched/scheduler.py: decode could not load the KV prefill announced
    _p(KV_LOAD_FAILED, "KV load failure", r"due to KV load failure|Recovered from KV load failure"),
    # vllm NIXL connector (nixl/base_worker.py): transfer_failed, transfer_exception...
    _p(KV_TRANSFER_FAILED, "NIXL transfer failure", r"NIXL transfer failure"),
    _p(KV_HANDSHAKE, "compatibility hash mismatch", r"NIXL compatibility hash mismatch"),
    _p(KV_HANDSHAKE, "handshake", r"NIXL transfer failure: handshake"),
    # NIXL leases: prefill freed blocks decode never read (a slow or stalled transfer)
    _p(KV_EXPIRED, "expired", r"Releasing expired KV blocks|Declining expired remote read"),
    # inference/router/backends.py: a prefill worker's lease ran out with hand-offs not pulled
    _p(KV_EXPIRED, "hand-offs never pulled", r"KV lease of \S+ s over with \d+ hand-offs never"),
    # inference/kv_connectors/shared_storage.py: the shared-storage channel could not write
    _p(KV_NOT_SAVED, "KV not saved", r"KV not saved to shared storage"),
    # inference/router/forward.py: the 502 kv_handoff_failed a client got
    _p(KV_HANDOFF_FAILED, "KV hand-off failed", r"KV hand-off failed"),
    # vllm/v1/engine: the engine core died (the server exits or answers 500 from then on)
    _p(ENGINE_DEAD, "EngineDeadError", r"EngineDeadError|Engine core initialization failed"),
    _p(ENGINE_DEAD, "died unexpectedly", r"died unexpectedly"),
    # inference/router/forward.py: a stream cut off by its worker
    _p(MID_STREAM, "failed mid-stream", r"failed mid-stream"),
    # console/supervisor/engine.py (last_error) and the start-stall kill
    _p(HEALTH_FAILING, "health check failing", r"health check failing"),
)
NEEDLES: tuple[str, ...] = tuple(dict.fromkeys(p.needle for p in PATTERNS))


def classify(text: str) -> str | None:
    """The first pattern's kind that ``text`` matches, or None."""
    return next((p.kind for p in PATTERNS if p.regex.search(text)), None)


_ESTIMATED = re.compile(r"estimated maximum model length is (\d+)")


def estimated_max_len(text: str) -> int | None:
    """The context length vLLM says would fit, from its out-of-KV-memory message."""
    found = _ESTIMATED.search(text)
    return int(found.group(1)) if found else None
