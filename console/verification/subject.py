"""What a verification runs against, read once from the plan and the process table."""

from __future__ import annotations

from dataclasses import dataclass

from console.deployments.models import Deployment
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

    @property
    def router_url(self) -> str:
        return self.router.url

    def role(self, role: str) -> list[Endpoint]:
        return [w for w in self.workers if w.role == role]

    def pairs(self) -> list[tuple[str, str]]:
        """Every prefill/decode pair as (prefill URL, decode URL); none for colocated plans."""
        return [(p.url, d.url) for p in self.role("prefill") for d in self.role("decode")]


def subject_of(deployment: Deployment) -> Subject:
    rows = {p.slot: p.pk for p in ManagedProcess.objects.filter(deployment=deployment)}
    workers = tuple(
        Endpoint(slot=w.slot, role=w.role, host=w.host, port=w.port, process_id=rows.get(w.slot),
                 node_memory_bytes=w.node.memory_bytes, node=w.node.name)
        for w in deployment.workers.select_related("node").order_by("role", "index"))
    router_url = router_address(deployment)
    host = router_url.removeprefix("http://").rsplit(":", 1)[0].strip("[]")
    side = tuple((w.slot, w.host, w.side_channel_port)
                 for w in deployment.workers.order_by("role", "index")
                 if w.side_channel_port and deployment.kv_channel == "nixl")
    return Subject(
        deployment_id=deployment.pk, name=deployment.name, model=deployment.served_model_name,
        mode=deployment.mode, kv_channel=deployment.kv_channel,
        router=Endpoint("router", "router", host, deployment.router_port, rows.get("router")),
        workers=workers, side_channels=side, api_key=console_key(deployment),
        worker_key=deployment_worker_key(deployment.name), concurrency=deployment.concurrency,
        max_model_len=deployment.max_model_len, ttft_slo_ms=deployment.ttft_slo_ms,
        tpot_slo_ms=deployment.tpot_slo_ms)


def live_revision(deployment: Deployment) -> int | None:
    """The number of the deployment's live revision, if it has one. Read through the reverse
    relation: importing the rollouts app here would break the layer order."""
    numbers = deployment.revisions.filter(state="live").values_list("number", flat=True)
    return max(numbers, default=None)
