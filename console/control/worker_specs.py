"""From a stored plan to the processes that run it: vLLM workers and the router."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from console.checks.suite import enforce_handshake_compat
from console.deployments.images import cache_flag_gb, mm_limits, router_max_images
from console.deployments.models import Deployment, WorkerPlan
from console.gateway.router_admin import admin_token
from console.gateway.services import write_keys_file
from console.gateway.usage import usage_file_path
from console.rollouts import revisions
from console.rollouts.models import Revision, Rollout
from console.rollouts.revisions import live_number
from console.supervisor.worker_keys import deployment_worker_key
from inference.kv_channels import KVChannel, make_channel, uses_transfer_params
from inference.launch import WorkerSpec, build_command
from inference.worker_auth import ROUTER_WORKER_KEY_ENV


@dataclass(frozen=True)
class ProcessSpec:
    slot: str
    role: str
    port: int
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # The node whose supervisor runs it (None: the console's own, where the router runs), and
    # the address it binds there, where the supervisor probes it.
    node_id: int | None = None
    host: str = "127.0.0.1"


def kv_storage_path(deployment: Deployment, revision: int | None = None) -> Path:
    """A revision's own KV directory (the live one's when not given): the shared-storage
    connector finds KV by prompt tokens, so two revisions sharing one directory would let one
    revision's decode load the other's prefilled KV. A deployment that has never been started
    since revisions exist has no number yet."""
    number = revision if revision is not None else live_number(deployment)
    return Path(settings.PDSERVE_KV_DIR) / (deployment.name if number is None
                                            else f"{deployment.name}@r{number}")


def kv_channel(deployment: Deployment, revision: int | None = None) -> KVChannel:
    return make_channel(deployment.kv_channel,
                        storage_path=kv_storage_path(deployment, revision))


def chat_template_path(deployment: Deployment) -> Path:
    return Path(settings.DATA_DIR) / "templates" / f"{deployment.name}.jinja"


def write_chat_template(deployment: Deployment) -> Path | None:
    """The plan's chat template as a file every worker and the router read at start, or None
    when the plan keeps the models' own. Replaced in one rename, so that a starting process
    never reads half a template; rewritten only when it changed (this runs on every tick)."""
    if not deployment.chat_template:
        return None
    path = chat_template_path(deployment)
    if path.is_file() and path.read_text(encoding="utf-8") == deployment.chat_template:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(deployment.chat_template)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def worker_spec(deployment: Deployment, worker: WorkerPlan,
                handshake_compat: bool = True, chat_template: Path | None = None,
                revision: int | None = None, remote_peers: bool = False) -> WorkerSpec:
    """``chat_template``: the file :func:`write_chat_template` wrote, when the plan has one;
    ``revision``: the revision the worker runs (the live one when not given); ``remote_peers``:
    its KV peers run on other nodes (:func:`has_remote_peers`)."""
    return WorkerSpec(
        role=worker.role,
        model_path=worker.variant.path,
        served_model_name=deployment.served_model_name,
        port=worker.port,
        max_model_len=deployment.max_model_len,
        kv_channel=None if worker.role == WorkerPlan.Role.COLOCATED else deployment.kv_channel,
        kv_storage_path=str(kv_storage_path(deployment, revision)),
        side_channel_port=worker.side_channel_port,
        host=worker.host,
        remote_peers=remote_peers,
        cpu_cores=worker.core_tuple(),
        gpu_indices=worker.gpu_tuple(),
        kv_cache_gib=deployment.kv_cache_gib,
        block_size=deployment.block_size,
        kv_cache_dtype=deployment.kv_cache_dtype,
        enforce_handshake_compat=handshake_compat,
        kv_load_failure=deployment.kv_load_failure,
        dtype=deployment.dtype,
        sampling_defaults=dict(deployment.sampling_defaults or {}),
        tool_call_parser=deployment.tool_call_parser,
        enable_auto_tool_choice=deployment.enable_auto_tool_choice,
        chat_template_path=str(chat_template) if chat_template is not None else None,
        reasoning_parser=deployment.reasoning_parser,
        cache_dir=str(settings.PDSERVE_CACHE_DIR),
        enforce_eager=settings.PDSERVE_ENFORCE_EAGER,
        mm_limits=mm_limits(deployment, worker),
        mm_processor_cache_gb=cache_flag_gb(deployment),
        extra_args=tuple(deployment.extra_engine_args or ()),
    )


def transfer_block_tokens(deployment: Deployment, workers: list[WorkerPlan]) -> int:
    """Tokens in one KV block: the plan's, else vLLM's default (128 on CPU, 16 on CUDA).

    A prompt within one block has no whole block to hand over, so the router lets decode
    compute it instead of paying a prefill round trip for nothing.
    """
    if deployment.block_size:
        return deployment.block_size
    return 16 if any(worker.gpu_indices for worker in workers) else 128


def router_argv(deployment: Deployment, workers: list[WorkerPlan],
                chat_template: Path | None = None, python: str = sys.executable) -> list[str]:
    by_role: dict[str, list[WorkerPlan]] = {}
    for worker in workers:
        by_role.setdefault(worker.role, []).append(worker)
    # The router checks prompt lengths with the tokenizer decode uses, since decode is the
    # side that renders chat requests a second time.
    tokenizer_worker = (by_role.get("decode") or by_role.get("colocated") or workers)[0]
    argv = [
        python, "-m", "inference.router",
        "--revision", str(live_number(deployment) or 1),
        "--served-model-name", deployment.served_model_name,
        "--tokenizer", tokenizer_worker.variant.path,
        "--max-model-len", str(deployment.max_model_len),
        "--kv-channel", deployment.kv_channel,
        "--host", deployment.router_host,
        "--port", str(deployment.router_port),
        "--local-prefill-max-tokens", str(transfer_block_tokens(deployment, workers)),
        # prefix_aware hashes whole blocks, so the router's block must be the workers'.
        "--prefix-block-size", str(transfer_block_tokens(deployment, workers)),
    ]
    # Images: checked by the router before any worker is called (plan values, validated: the
    # directories absolute and existing, the hosts bare host names).
    argv += ["--max-images", str(router_max_images(deployment, workers)),
             "--max-image-bytes", str(deployment.max_image_bytes),
             "--max-image-pixels", str(deployment.max_image_pixels)]
    for path in deployment.media_paths or ():
        argv += ["--media-path", path]
    for host in deployment.media_domains or ():
        argv += ["--media-domain", host]
    if chat_template is not None:
        # The router renders chat prompts itself (length checks, the PD hand-off's comparison
        # with prefill's tokens): with another template than the workers' every hand-off
        # would fall back to decode recomputing the prompt.
        argv += ["--chat-template", str(chat_template)]
    if deployment.mode == Deployment.Mode.COLOCATED:
        argv += ["--colocated-policy", deployment.decode_policy]
    else:
        argv += ["--prefill-policy", deployment.prefill_policy,
                 "--decode-policy", deployment.decode_policy,
                 "--pd-policy", deployment.pd_policy,
                 "--stall-budget-ms", str(deployment.stall_budget_ms)]
        if not deployment.degraded_mode:
            argv += ["--no-degraded-mode"]
        if uses_transfer_params(deployment.kv_channel):
            # vLLM connects a NIXL pair on its first hand-off; the router makes that one
            # itself (two blocks, so that a whole block moves) before it reports healthy.
            warmup = min(2 * transfer_block_tokens(deployment, workers),
                         deployment.max_model_len - 1)
            argv += ["--kv-warmup-tokens", str(warmup)]
    for role, flag in (("prefill", "--prefill"), ("decode", "--decode"), ("colocated", "--colocated")):
        for worker in by_role.get(role, []):
            argv += [flag, worker.url]
    return argv


def has_remote_peers(worker: WorkerPlan, workers: list[WorkerPlan]) -> bool:
    """Whether a worker of the other role runs on another node than ``worker``."""
    return any(peer.node_id != worker.node_id for peer in workers if peer.role != worker.role)


def process_specs(deployment: Deployment,
                  held_back: frozenset[str] = frozenset()) -> list[ProcessSpec]:
    """The plan's processes. ``held_back``: slots an in-place rollout has given to green's
    workers (on the same ports): neither run, nor put in the router's live group."""
    workers = [w for w in deployment.workers.select_related("variant", "node").order_by("role", "index")
               if w.slot not in held_back]
    # NIXL's path check goes off only where the plan checks proved the caches compatible.
    handshake_compat = enforce_handshake_compat(deployment)
    chat_template = write_chat_template(deployment)
    specs = []
    for worker in workers:
        argv, env = build_command(worker_spec(deployment, worker, handshake_compat,
                                              chat_template,
                                              remote_peers=has_remote_peers(worker, workers)))
        specs.append(ProcessSpec(slot=worker.slot, role=worker.role, port=worker.port,
                                 argv=argv, env=env, node_id=worker.node_id, host=worker.host))
    specs.append(router_spec(deployment, workers, chat_template, write_keys_file(deployment),
                             usage_file=usage_file_path(deployment)))
    return specs


def router_spec(deployment: Deployment, workers: list[WorkerPlan], chat_template: Path | None,
                keys_file: Path, python: str = sys.executable,
                usage_file: Path | None = None) -> ProcessSpec:
    """The router's process: its argv (:func:`router_argv`, then the key set's file and the
    usage ledger's) and its environment, which carries the secrets. ``usage_file``: where its
    usage ledger outlives it (console/gateway/usage.py); without one it meters in memory, as
    an exported router (k8s_manifests.py) does, whose pod has no volume for it."""
    router_env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if settings.PDSERVE_API_KEY:
        router_env["PDSERVE_API_KEY"] = settings.PDSERVE_API_KEY
    # The router reads the current key set at start; the console pushes later changes through
    # the admin API with this token (environment, never argv: argv shows in `ps`).
    router_env["PDSERVE_ROUTER_ADMIN_TOKEN"] = admin_token(deployment)
    # The key its workers refuse callers without (the supervisor starts them with it).
    router_env[ROUTER_WORKER_KEY_ENV] = deployment_worker_key(deployment.name)
    if settings.REDIS_URL:
        # Shared rate limits: it inherits nothing of the supervisor's secrets, so it is named.
        router_env["REDIS_URL"] = settings.REDIS_URL
    router_args = [*router_argv(deployment, workers, chat_template, python),
                   "--keys-file", str(keys_file)]
    if usage_file is not None:
        router_args += ["--usage-file", str(usage_file)]
    return ProcessSpec(slot="router", role="router", port=deployment.router_port,
                       argv=router_args, env=router_env, host=deployment.router_host)


def green_slot(slot: str, revision: Revision) -> str:
    """A rollout's green worker's slot beside the live one's: ``prefill-0@r2``."""
    return f"{slot}@r{revision.number}"


def retired_slot(slot: str, revision: Revision) -> str:
    """A promoted rollout's blue worker's slot while it stops: ``prefill-0@r1-retired``. Not
    ``green_slot``'s: a rollback to ``revision`` asked for at once would take the worker still
    stopping for its own green, ready at once but on blue's old ports, and keep it running."""
    return f"{green_slot(slot, revision)}-retired"


def green_workers(deployment: Deployment, rollout: Rollout) -> list[WorkerPlan]:
    """The rollout's green workers as unsaved plan rows: the revision's settings and variants,
    laid out as the plan lays its roles out, on the ports chosen for the rollout."""
    workers = revisions.shadow_workers(deployment, rollout.to_revision.spec)
    for worker in workers:
        ports = rollout.green_ports[worker.slot]
        worker.port, worker.side_channel_port = ports["port"], ports["side_channel_port"]
    return workers


def green_specs(deployment: Deployment, rollout: Rollout,
                units: set[int] | None = None) -> list[ProcessSpec]:
    """Green's process specs; ``units``: only the pairs of these indexes (in place)."""
    workers = [w for w in green_workers(deployment, rollout) if units is None or w.index in units]
    # One variant everywhere: NIXL's check stays on. Different ones passed the KV checks when
    # the rollout was made (it is refused otherwise), as a plan's do before it may start.
    handshake_compat = len({w.variant.pk for w in workers}) == 1
    chat_template = write_chat_template(deployment)
    specs = []
    for worker in workers:
        argv, env = build_command(worker_spec(worker.deployment, worker, handshake_compat,
                                              chat_template, rollout.to_revision.number,
                                              has_remote_peers(worker, workers)))
        specs.append(ProcessSpec(slot=green_slot(worker.slot, rollout.to_revision),
                                 role=worker.role, port=worker.port, argv=argv, env=env,
                                 node_id=worker.node_id, host=worker.host))
    return specs
