"""A deployment plan loaded once, with everything the checks read, and the values each side uses.

"Side" is a worker's effective setting: what vLLM on that worker will actually run with once
the plan's values, the variant's files and the node's engine are combined.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from console.catalog.models import Variant
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import Node
from console.fleet.services import local_node
from console.supervisor.models import ManagedProcess

# Block sizes vLLM 0.32 picks when none is given: the CPU backend always 128
# (platforms/cpu.py); on CUDA the attention backend decides, 16 for FlashAttention.
DEFAULT_BLOCK_SIZE = {"cpu": 128, "gpu": 16}
# The generation-config keys vLLM applies as sampling defaults (config/model.py,
# get_diff_sampling_param); the plan's sampling defaults override them.
ROLE_ORDER = {"prefill": 0, "decode": 1, "colocated": 2}
SAMPLING_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "temperature",
                 "top_k", "top_p", "min_p", "max_new_tokens")


@dataclass
class PlanView:
    deployment: Deployment
    workers: list[WorkerPlan]
    # Workers and routers of other running deployments on the same nodes: they hold ports,
    # cores and memory this plan must not count on.
    neighbours: list[WorkerPlan]
    neighbour_deployments: list[Deployment]
    processes: list[ManagedProcess]  # this deployment's live processes
    local_node: Node

    @classmethod
    def load(cls, deployment: Deployment) -> PlanView:
        local = local_node()
        workers = sorted(
            deployment.workers.select_related("variant__base", "node").prefetch_related("node__gpus"),
            key=lambda w: (ROLE_ORDER.get(w.role, len(ROLE_ORDER)), w.index),
        )
        node_ids = {w.node_id for w in workers} | {local.pk}
        others = (Deployment.objects.exclude(pk=deployment.pk)
                  .filter(desired_state=Deployment.DesiredState.RUNNING))
        neighbours = list(
            WorkerPlan.objects.filter(deployment__in=others, node_id__in=node_ids)
            .select_related("deployment", "variant", "node")
        )
        processes = list(ManagedProcess.objects.filter(
            deployment=deployment, state__in=ManagedProcess.ALIVE_STATES))
        return cls(deployment, workers, neighbours, list(others), processes, local)

    @classmethod
    def workers_only(cls, deployment: Deployment) -> PlanView:
        """The plan's own workers and nothing live (no discovery, no neighbours): for launching."""
        workers = sorted(
            deployment.workers.select_related("variant", "node"),
            key=lambda w: (ROLE_ORDER.get(w.role, len(ROLE_ORDER)), w.index),
        )
        return cls(deployment, workers, [], [], [], Node.objects.local() or local_node())

    # ---- groups -----------------------------------------------------------------------------
    @property
    def is_pd(self) -> bool:
        return self.deployment.mode == Deployment.Mode.PD

    def role_of(self, worker: WorkerPlan) -> list[WorkerPlan]:
        return [w for w in self.workers if w.role == worker.role]

    def variants(self) -> list[Variant]:
        seen: dict[int, Variant] = {}
        for worker in self.workers:
            seen.setdefault(worker.variant_id, worker.variant)
        return list(seen.values())

    def uninspected(self) -> list[Variant]:
        return [v for v in self.variants() if not v.inspected]

    def is_local(self, node: Node) -> bool:
        return node.pk == self.local_node.pk

    # ---- each side's effective values -------------------------------------------------------
    def compute_dtype(self, worker: WorkerPlan) -> str:
        dtype = self.deployment.dtype
        return worker.variant.dtype if dtype == Deployment.Dtype.AUTO else dtype

    def kv_dtype(self, worker: WorkerPlan) -> str:
        if self.deployment.kv_cache_dtype != Deployment.KVCacheDtype.AUTO:
            return self.deployment.kv_cache_dtype
        if worker.variant.kv_dtype_from_checkpoint:
            return worker.variant.kv_dtype
        return self.compute_dtype(worker)

    @staticmethod
    def device_kind(worker: WorkerPlan) -> str:
        return "gpu" if worker.gpu_tuple() else "cpu"

    def block_size(self, worker: WorkerPlan) -> int:
        return self.deployment.block_size or DEFAULT_BLOCK_SIZE[self.device_kind(worker)]

    def sampling(self, worker: WorkerPlan) -> dict[str, Any]:
        """What vLLM applies: the model's generation config, overridden by the plan's defaults."""
        merged = {**worker.variant.generation_config, **(self.deployment.sampling_defaults or {})}
        return {key: merged[key] for key in SAMPLING_KEYS if merged.get(key) is not None}


def group(workers: list[WorkerPlan],
          value_of: Callable[[WorkerPlan], Hashable]) -> dict[Hashable, list[WorkerPlan]]:
    groups: dict[Hashable, list[WorkerPlan]] = {}
    for worker in workers:
        groups.setdefault(value_of(worker), []).append(worker)
    return groups


def who(workers: list[WorkerPlan], plan: PlanView) -> str:
    """'prefill' when these are all of the prefill pool, else their slots: 'decode-0, decode-2'."""
    parts = []
    for role in dict.fromkeys(w.role for w in workers):
        mine = [w for w in workers if w.role == role]
        if len(mine) == len([w for w in plan.workers if w.role == role]):
            parts.append(role)
        else:
            parts.extend(w.slot for w in mine)
    return ", ".join(parts)


def variant_names(workers: list[WorkerPlan]) -> str:
    return ", ".join(dict.fromkeys(w.variant.name for w in workers))


def node_names(workers: list[WorkerPlan]) -> str:
    return "node " + ", ".join(dict.fromkeys(w.node.name for w in workers))


def describe(plan: PlanView, value_of: Callable[[WorkerPlan], Hashable],
             show: Callable[[Any], str] = str,
             where: Callable[[list[WorkerPlan]], str] = variant_names) -> tuple[int, str]:
    """How many distinct values the workers have, and 'prefill (bf16): X; decode (w8a8): Y'."""
    groups = group(plan.workers, value_of)
    text = "; ".join(f"{who(ws, plan)} ({where(ws)}): {show(value)}"
                     for value, ws in groups.items())
    return len(groups), text
