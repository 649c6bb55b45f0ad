"""What a verification runs against, read once from the plan and the process table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from console.deployments.images import router_max_images
from console.deployments.models import Deployment, WorkerPlan
from console.gateway.router_admin import console_key, router_address
from console.supervisor.models import ManagedProcess
from console.supervisor.worker_keys import deployment_worker_key


@dataclass(frozen=True)
class Endpoint:
    """A planned process: a worker or the router, with its row in the process table if any."""

    slot: str
    role: str
    host: str
    port: int
    process_id: int | None
    node_memory_bytes: int = 0
    node: str = ""
    # The memory of the GPUs it runs on (0: a CPU worker).
    gpu_memory_bytes: int = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class Subject:
    deployment_id: int
    name: str
    model: str
    mode: str
    kv_channel: str
    router: Endpoint
    workers: tuple[Endpoint, ...]
    # Side-channel ports (NIXL): slot -> port.
    side_channels: tuple[tuple[str, str, int], ...]
    api_key: str
    worker_key: str
    concurrency: int
    max_model_len: int
    ttft_slo_ms: int
    tpot_slo_ms: int
    # What every planned variant takes (Variant.modalities): "image" when all of them do.
    modalities: tuple[str, ...] = ("text",)
    # Images a request may carry through the router (console/deployments/images.py).
    max_images: int = 0

    @property
    def takes_images(self) -> bool:
        return "image" in self.modalities and self.max_images > 0

    @property
    def router_url(self) -> str:
        return self.router.url

    def role(self, role: str) -> list[Endpoint]:
        return [w for w in self.workers if w.role == role]

    def pairs(self) -> list[tuple[str, str]]:
        """Every prefill/decode pair as (prefill URL, decode URL); none for colocated plans."""
        return [(p.url, d.url) for p in self.role("prefill") for d in self.role("decode")]


def subject_of(deployment: Deployment, green: int | None = None,
               green_side_channels: Mapping[str, int] | None = None) -> Subject:
    """The deployment's planned workers and router; ``green``: a rollout's green revision's
    workers instead (its process rows, ``prefill-0@r<green>``, on the ports chosen for the
    rollout), for the report a rollout asks before it promotes green. Green's NIXL side
    channels are not in the plan until the promotion: the rollout names them
    (``green_side_channels``, base slot -> port, in the report's options)."""
    rows = {p.slot: p for p in ManagedProcess.objects.filter(deployment=deployment)}
    planned = list(deployment.workers.select_related("node", "variant")
                   .prefetch_related("node__gpus").order_by("role", "index"))
    gpu_memory = {w.slot: sum(g.memory_bytes for g in w.node.gpus.all() if g.index in w.gpu_tuple())
                  for w in planned}
    mode = deployment.mode
    if green is None:
        workers = tuple(
            Endpoint(slot=w.slot, role=w.role, host=w.host, port=w.port,
                     process_id=rows[w.slot].pk if w.slot in rows else None,
                     node_memory_bytes=w.node.memory_bytes, node=w.node.name,
                     gpu_memory_bytes=gpu_memory[w.slot])
            for w in planned)
        side = tuple((w.slot, w.host, w.side_channel_port) for w in planned
                     if w.side_channel_port and deployment.kv_channel == "nixl")
    else:
        # Green's pools are laid out as the plan's (console/rollouts/revisions.py), so each
        # green worker runs on the node of the planned worker of its base slot.
        nodes = {w.slot: w.node for w in planned}
        suffix = f"@r{green}"
        found, channels = [], []
        green_channels = green_side_channels or {}
        for slot, row in sorted(rows.items(), key=lambda item: (item[1].role, item[0])):
            if not slot.endswith(suffix) or row.port is None:
                continue
            base = slot.removesuffix(suffix)
            node = nodes.get(base)
            found.append(Endpoint(slot=slot, role=row.role, host=row.host, port=row.port,
                                  process_id=row.pk,
                                  node_memory_bytes=node.memory_bytes if node else 0,
                                  node=node.name if node else "",
                                  gpu_memory_bytes=gpu_memory.get(base, 0)))
            if base in green_channels:
                channels.append((slot, row.host, int(green_channels[base])))
        workers = tuple(found)
        side = tuple(channels)
        # A revision may switch between colocated and PD.
        mode = "colocated" if any(w.role == "colocated" for w in workers) else "pd"
    router_url = router_address(deployment)
    host = router_url.removeprefix("http://").rsplit(":", 1)[0].strip("[]")
    return Subject(
        deployment_id=deployment.pk, name=deployment.name, model=deployment.served_model_name,
        mode=mode, kv_channel=deployment.kv_channel,
        router=Endpoint("router", "router", host, deployment.router_port,
                        rows["router"].pk if "router" in rows else None),
        workers=workers, side_channels=side, api_key=console_key(deployment),
        worker_key=deployment_worker_key(deployment.name), concurrency=deployment.concurrency,
        max_model_len=deployment.max_model_len, ttft_slo_ms=deployment.ttft_slo_ms,
        tpot_slo_ms=deployment.tpot_slo_ms, modalities=shared_modalities(planned),
        max_images=router_max_images(deployment, planned))


def shared_modalities(planned: list[WorkerPlan]) -> tuple[str, ...]:
    """The inputs every planned worker's variant takes, in the first one's order: prefill and
    decode both read a request's images. A variant not inspected yet names none: text."""
    if not planned:
        return ("text",)
    kinds = [list(w.variant.modalities or ["text"]) for w in planned]
    return tuple(m for m in kinds[0] if all(m in other for other in kinds[1:]))


def live_revision(deployment: Deployment) -> int | None:
    """The number of the deployment's live revision, if it has one. Read through the reverse
    relation: importing the rollouts app here would break the layer order."""
    numbers = deployment.revisions.filter(state="live").values_list("number", flat=True)
    return max(numbers, default=None)
