"""KV transfer channels: how a prefill worker's KV cache reaches a decode worker.

Each channel is one class behind :class:`KVChannel`. It turns a worker's role into vLLM's
``--kv-transfer-config`` JSON, the environment the connector needs, and any extra engine flags.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from inference.net_devices import ucx_net_devices

Role = Literal["prefill", "decode", "colocated"]
Device = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class ChannelEndpoint:
    """What a channel needs to know about one worker."""

    role: Role
    host: str = "127.0.0.1"
    side_channel_port: int | None = None
    device: Device = "cpu"  # where the worker keeps its KV cache
    # Its KV peers run on other nodes of the plan: NIXL moves KV over the network only.
    remote_peers: bool = False


class KVChannel:
    name: ClassVar[str]
    # Whether the router must carry the prefill's kv_transfer_params to decode.
    uses_transfer_params: ClassVar[bool]

    def transfer_config(self, endpoint: ChannelEndpoint) -> dict[str, object]:
        raise NotImplementedError

    def environment(self, endpoint: ChannelEndpoint) -> dict[str, str]:
        return {}

    def extra_engine_args(self, endpoint: ChannelEndpoint, max_model_len: int) -> list[str]:
        return []

    def prepare(self) -> None:
        """Called once before the deployment's workers start."""


# The UCX transports NIXL may use. On a CPU: TCP and shared memory, as measured here. On CUDA
# also GPU memory itself: cuda_ipc between the GPUs of one machine, rc (InfiniBand, RoCE) between
# machines; TCP stays the fallback. UCX warns about a listed transport a machine lacks and uses
# the others.
UCX_TRANSPORTS: dict[Device, str] = {"cpu": "tcp,self,sm",
                                     "cuda": "cuda_copy,cuda_ipc,rc,tcp,self,sm"}
# Peers on other nodes: no shared memory. It cannot reach another machine anyway, and UCX
# judges a peer reachable over it by boot id and IPC namespace alone, so nodes that share one
# kernel (containers, network namespaces) would move KV through /dev/shm instead of the
# network the plan names (measured: 900 bytes on the veth of a 16 MiB read with sm listed,
# 16.9 MB without).
UCX_REMOTE_TRANSPORTS: dict[Device, str] = {"cpu": "tcp,self", "cuda": "cuda_copy,rc,tcp,self"}


@dataclass(frozen=True)
class NixlChannel(KVChannel):
    """vLLM's NixlConnector over UCX, on the worker's address.

    The decode side pulls KV blocks from the prefill side; each worker needs its own
    side-channel port for the NIXL metadata handshake, on the address it advertises (prefill's
    is handed to decode with the KV's description).
    """

    name: ClassVar[str] = "nixl"
    uses_transfer_params: ClassVar[bool] = True
    # Different quantized variants of one base model have different model paths, which
    # NIXL's compatibility hash includes; only the plan checks may switch this off.
    enforce_handshake_compat: bool = True

    def transfer_config(self, endpoint: ChannelEndpoint) -> dict[str, object]:
        config: dict[str, object] = {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_producer" if endpoint.role == "prefill" else "kv_consumer",
            # On CUDA, NIXL registers the KV cache in GPU memory and moves it from there; "cpu"
            # would copy every block to host memory first.
            "kv_buffer_device": endpoint.device,
        }
        if not self.enforce_handshake_compat:
            config["kv_connector_extra_config"] = {"enforce_handshake_compat": False}
        return config

    def environment(self, endpoint: ChannelEndpoint) -> dict[str, str]:
        if endpoint.side_channel_port is None:
            raise ValueError(f"nixl channel: {endpoint.role} worker needs a side-channel port")
        env = {
            "UCX_TLS": (UCX_REMOTE_TRANSPORTS if endpoint.remote_peers
                        else UCX_TRANSPORTS)[endpoint.device],
            "VLLM_NIXL_SIDE_CHANNEL_HOST": endpoint.host,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(endpoint.side_channel_port),
        }
        devices = ucx_net_devices(endpoint.host, rdma=endpoint.device == "cuda")
        if devices is not None:
            env["UCX_NET_DEVICES"] = devices
        return env


@dataclass(frozen=True)
class SharedStorageChannel(KVChannel):
    """vLLM's ExampleConnector: KV saved as safetensors files in a directory both sides read.

    Files are keyed by a hash of the prompt tokens only (not the model), so the directory is
    per deployment and emptied before every start; vLLM never deletes them, so pdserve sweeps
    files older than ``retention_s``.
    """

    name: ClassVar[str] = "shared-storage"
    uses_transfer_params: ClassVar[bool] = False
    path: Path = field(default_factory=lambda: Path("/dev/shm/pdserve-kv"))
    retention_s: float = 300.0

    def transfer_config(self, endpoint: ChannelEndpoint) -> dict[str, object]:
        return {
            # ExampleConnector with a fix for one-token prompts (inference/kv_connectors).
            "kv_connector": "PdserveSharedStorageConnector",
            "kv_connector_module_path": "inference.kv_connectors.shared_storage",
            "kv_role": "kv_producer" if endpoint.role == "prefill" else "kv_consumer",
            "kv_connector_extra_config": {"shared_storage_path": str(self.path)},
        }

    def extra_engine_args(self, endpoint: ChannelEndpoint, max_model_len: int) -> list[str]:
        if endpoint.role != "prefill":
            return []
        # ExampleConnector saves a request's KV at its first scheduled step; with chunked
        # prefill a long prompt would be saved partially and crash decode with a shape
        # mismatch. So the prefill worker takes every prompt in one step.
        return [
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            str(max_model_len),
        ]

    def prepare(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True, exist_ok=True)

    def sweep(self, now: float | None = None) -> int:
        """Delete KV folders older than the retention; returns how many were removed."""
        if not self.path.is_dir():
            return 0
        cutoff = (now if now is not None else time.time()) - self.retention_s
        removed = 0
        for entry in self.path.iterdir():
            try:
                if entry.stat().st_mtime < cutoff:
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed


CHANNEL_NAMES = (NixlChannel.name, SharedStorageChannel.name)
_CHANNEL_CLASSES: dict[str, type[KVChannel]] = {NixlChannel.name: NixlChannel,
                                                SharedStorageChannel.name: SharedStorageChannel}


def uses_transfer_params(name: str) -> bool:
    """Whether the router must carry prefill's ``kv_transfer_params`` to decode."""
    if name not in _CHANNEL_CLASSES:
        raise ValueError(f"unknown KV channel {name!r}; expected one of {', '.join(CHANNEL_NAMES)}")
    return _CHANNEL_CLASSES[name].uses_transfer_params


def make_channel(name: str, *, storage_path: Path | None = None,
                 enforce_handshake_compat: bool = True) -> KVChannel:
    if name == NixlChannel.name:
        return NixlChannel(enforce_handshake_compat=enforce_handshake_compat)
    if name == SharedStorageChannel.name:
        if storage_path is None:
            raise ValueError("shared-storage channel needs a storage path")
        return SharedStorageChannel(path=storage_path)
    raise ValueError(f"unknown KV channel {name!r}; expected one of {', '.join(CHANNEL_NAMES)}")
