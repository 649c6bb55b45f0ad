"""Every `vllm serve` flag, classified: who may give it as an extra engine flag of a plan.

The table is an allow-list. A flag is named as vLLM's parser knows it (its first long option, or
the dest of a positional argument); every spelling vLLM accepts (underscores, abbreviations,
``--no-`` forms, dotted sub-keys) maps to that name before it is looked up here
(:mod:`console.deployments.engine_args`). A flag of vLLM's that the table does not name is refused
as "not classified": tests/console/test_engine_flags.py fails when vLLM's flag list and this
table disagree, so an engine upgrade cannot open a hole silently.

- ``tuning``: performance and behaviour knobs; a team admin may set them.
- ``superuser``: reads files, loads code, reaches the network or changes whom the worker trusts;
  only a superuser may set them.
- ``owned``: pdserve sets them from the plan; nobody gives them again (the message names the plan
  field to change instead).
- ``refused``: nobody: they make no sense for a worker pdserve manages behind its router.
"""

from __future__ import annotations

import enum


class FlagClass(enum.StrEnum):
    TUNING = "tuning"
    SUPERUSER = "superuser"
    OWNED = "owned"
    REFUSED = "refused"


# flag -> its class; flag -> why (one line per group, shown in refusals).
CLASSES: dict[str, FlagClass] = {}
REASONS: dict[str, str] = {}


def _group(kind: FlagClass, reason: str, *flags: str) -> None:
    for flag in flags:
        assert flag not in CLASSES, f"{flag} is classified twice"
        CLASSES[flag] = kind
        REASONS[flag] = reason


OWNED, SUPERUSER, TUNING, REFUSED = (FlagClass.OWNED, FlagClass.SUPERUSER, FlagClass.TUNING,
                                     FlagClass.REFUSED)

# --- owned: pdserve sets these; the reason names the plan field that does ---------------------
_group(OWNED, "the variant of each pool decides the model and its weights; change the variant",
       "model_tag", "--model", "--tokenizer", "--quantization", "--quantization-config")
_group(OWNED, "set from the plan's served_model_name", "--served-model-name")
_group(OWNED, "the supervisor chooses where each worker listens (the instance's node and port)",
       "--host", "--port", "--uds")
_group(OWNED, "the router's worker API key is set by pdserve", "--api-key")
_group(OWNED, "set from the plan's max_model_len", "--max-model-len")
_group(OWNED, "set from the plan's dtype", "--dtype")
_group(OWNED, "set from the plan's kv_cache_dtype and block_size (prefill and decode must agree "
              "on the KV layout)",
       "--kv-cache-dtype", "--block-size", "--kv-cache-dtype-skip-layers")
_group(OWNED, "the KV cache size is the plan's kv_cache_gib (or --gpu-memory-utilization on a "
              "GPU)",
       "--kv-cache-memory-bytes", "--num-gpu-blocks-override")
_group(OWNED, "the plan's kv_channel sets the KV connector and its events",
       "--kv-transfer-config", "--kv-events-config", "--kv-offloading-size",
       "--kv-offloading-backend")
_group(OWNED, "set from the plan's sampling_defaults",
       "--override-generation-config", "--generation-config")
_group(OWNED, "set from the plan's tool_call_parser, enable_auto_tool_choice, chat_template and "
              "reasoning_parser (the router renders prompts with the same template)",
       "--tool-call-parser", "--enable-auto-tool-choice", "--chat-template", "--reasoning-parser",
       "--reasoning-config")
_group(OWNED, "set from the plan's enforce_eager", "--enforce-eager")
_group(OWNED, "set from the plan's max_images_per_prompt for a multimodal variant (the router "
              "enforces the same count)",
       "--limit-mm-per-prompt", "--language-model-only")
_group(OWNED, "the supervisor's health probes and the request timeline rely on these logs",
       "--disable-access-log-for-endpoints", "--enable-log-requests", "--max-log-len")
_group(OWNED, "follows from each instance's GPUs (gpu_indices: tensor parallel over them) and "
              "cores (cpu_cores); give the instances devices, or more instances",
       "--tensor-parallel-size", "--pipeline-parallel-size", "--distributed-executor-backend",
       "--device-ids", "--numa-bind", "--numa-bind-nodes", "--numa-bind-cpus",
       "--data-parallel-size", "--data-parallel-rank", "--data-parallel-start-rank",
       "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port",
       "--data-parallel-backend", "--data-parallel-hybrid-lb", "--data-parallel-external-lb",
       "--data-parallel-multi-port-external-lb", "--data-parallel-supervisor-port",
       "--dp-supervisor-probe-interval-s", "--dp-supervisor-probe-timeout-s",
       "--dp-supervisor-probe-failure-threshold", "--decode-context-parallel-size",
       "--prefill-context-parallel-size", "--nnodes", "--node-rank", "--master-addr",
       "--master-port", "--api-server-count", "--headless")

# --- superuser: files, code, network, trust ---------------------------------------------------
_group(SUPERUSER, "imports Python code named by the flag",
       "--tool-parser-plugin", "--reasoning-parser-plugin", "--middleware", "--logits-processors",
       "--io-processor-plugin", "--model-class-overrides", "--worker-cls",
       "--worker-extension-cls", "--scheduler-cls", "--compilation-config",
       "--structured-outputs-config", "--additional-config")
_group(SUPERUSER, "runs code shipped with the model, or lets clients send what the worker "
                  "trusts (templates, tensors, media)",
       "--trust-remote-code", "--trust-request-chat-template", "--trust-request-mm-kwargs",
       "--enable-prompt-embeds", "--enable-mm-embeds", "--hf-overrides")
_group(SUPERUSER, "reads or writes files on the worker's machine",
       "--lora-modules", "--default-mm-loras", "--allowed-local-media-path", "--hf-config-path",
       "--download-dir", "--load-format", "--model-loader-extra-config",
       "--pt-load-map-location", "--ignore-patterns", "--ssl-keyfile", "--ssl-certfile",
       "--ssl-ca-certs", "--enable-ssl-refresh", "--ssl-cert-reqs", "--ssl-ciphers",
       "--mm-encoder-fp8-scale-path", "--mm-encoder-fp8-scale-save-path", "--logging-config",
       "--log-config-file", "--profiler-config")
_group(SUPERUSER, "reaches the network, or changes who may call the worker",
       "--hf-token", "--allowed-media-domains", "--tool-server", "--otlp-traces-endpoint",
       "--weight-transfer-config", "--allow-credentials", "--allowed-origins",
       "--allowed-methods", "--allowed-headers")
_group(SUPERUSER, "speculative decoding loads a second model named by the flag",
       "--speculative-config", "--spec-method", "--spec-model")

# --- refused: nobody --------------------------------------------------------------------------
_group(REFUSED, "reads vLLM options from a file, any of them, past these checks", "--config")
_group(REFUSED, "prints help and exits", "--help")
_group(REFUSED, "the router speaks OpenAI HTTP to the worker's port at its root",
       "--grpc", "--grpc-port", "--root-path", "--tokens-only", "--enable-scale-out",
       "--runner", "--convert", "--pooler-config", "--diffusion-config")
_group(REFUSED, "the router renders chat prompts and tokenizes with the variant's tokenizer: "
                "the workers must render and tokenize the same way",
       "--chat-template-content-format", "--default-chat-template-kwargs",
       "--exclude-tools-when-tool-choice-none", "--cohere-is-reasoning-model", "--cohere-format",
       "--tokenizer-mode", "--skip-tokenizer-init", "--config-format")
_group(REFUSED, "pdserve serves a prepared local model directory offline",
       "--revision", "--code-revision", "--tokenizer-revision")
_group(REFUSED, "parallelism pdserve does not lay out (expert, data and context parallel "
                "knobs): its placement and memory checks assume tensor parallelism",
       "--enable-expert-parallel", "--enable-eplb", "--eplb-config",
       "--expert-placement-strategy", "--all2all-backend", "--enable-elastic-ep",
       "--elastic-ep-max-dp-size", "--enable-ep-weight-filter", "--enable-dbo",
       "--dbo-decode-token-threshold", "--dbo-prefill-token-threshold", "--ubatch-size",
       "--dp-sync-interval", "--disable-nccl-for-dp-synchronization", "--dcp-comm-backend",
       "--dcp-q-replicate", "--dcp-kv-cache-interleave-size", "--cp-kv-cache-interleave-size",
       "--ec-transfer-config", "--ec-manager-config", "--mm-encoder-only")
_group(REFUSED, "debugging features that hand the engine's state to clients or pause it",
       "--enable-trace-replay", "--enable-sleep-mode", "--sleep-mode-offload-cudagraph",
       "--sleep-preserve-parameter-names", "--enable-nccl-comm-suspend",
       "--ray-workers-use-nsight")

# --- tuning: a team admin's --------------------------------------------------------------------
_group(TUNING, "scheduling and batching",
       "--max-num-batched-tokens", "--max-num-scheduled-tokens", "--max-num-seqs",
       "--max-num-active-seqs", "--max-num-queued-reqs", "--max-num-queued-tokens",
       "--long-prefill-token-threshold", "--long-prefill-token-threshold-adaptive",
       "--scheduling-policy", "--enable-chunked-prefill", "--disable-chunked-mm-input",
       "--scheduler-reserve-full-isl", "--watermark", "--prefill-schedule-interval",
       "--disable-hybrid-kv-cache-manager", "--async-scheduling", "--stream-interval")
_group(TUNING, "memory and caching",
       "--gpu-memory-utilization", "--enable-prefix-caching", "--prefix-caching-hash-algo",
       "--prefix-cache-retention-interval", "--kv-sharing-fast-prefill", "--swa-bounded-replay",
       "--mamba-cache-dtype", "--mamba-ssm-cache-dtype", "--mamba-block-size",
       "--prefix-match-unit", "--mamba-cache-mode", "--enable-mamba-shared-prefix-checkpoint",
       "--replayssm-buffer-len", "--use-replayssm", "--enable-cumem-allocator",
       "--offload-backend", "--cpu-offload-gb", "--cpu-offload-params", "--offload-group-size",
       "--offload-num-in-group", "--offload-prefetch-step", "--offload-params")
_group(TUNING, "kernels, compilation and attention backends",
       "--attention-backend", "--attention-config", "--mamba-backend", "--mamba-ssu-algorithm",
       "--enable-mamba-cache-stochastic-rounding", "--mamba-cache-philox-rounds",
       "--cudagraph-capture-sizes", "--max-cudagraph-capture-size", "--ir-op-priority",
       "--enable-flashinfer-autotune", "--moe-backend", "--linear-backend",
       "--sparse-indexer-topk-backend", "--kernel-config", "--optimization-level",
       "--performance-mode", "--disable-sliding-window", "--disable-cascade-attn",
       "--model-impl", "--disable-custom-all-reduce", "--enable-hc-sp",
       "--enable-batch-sharded-sampling", "--enable-shm-tensor-arena", "--engram-config",
       "--gdn-prefill-backend", "--kda-prefill-backend", "--kda-decode-backend",
       "--allow-deprecated-quantization", "--spec-tokens")
_group(TUNING, "loading the prepared weights",
       "--safetensors-load-strategy", "--safetensors-prefetch-num-threads",
       "--safetensors-prefetch-block-size", "--use-tqdm-on-load",
       "--max-parallel-loading-workers", "--renderer-num-workers")
_group(TUNING, "sampling and output options of the API",
       "--seed", "--max-logprobs", "--logprobs-mode", "--use-fp64-gumbel",
       "--return-sampling-mask", "--enable-return-routed-experts", "--aux-output-config",
       "--response-role", "--return-tokens-as-token-ids", "--tool-strict-level",
       "--enable-prompt-tokens-details", "--enable-force-include-usage",
       "--sse-keep-alive-interval", "--anthropic-disabled-thinking-effort",
       "--fingerprint-mode", "--fingerprint-value", "--enable-request-id-headers",
       "--disable-fastapi-docs", "--enable-offline-docs", "--enable-tokenizer-info-endpoint",
       "--enable-flash-late-interaction", "--h11-max-incomplete-event-size",
       "--h11-max-header-count", "--watermark-config")
_group(TUNING, "multimodal inputs and LoRA adapters (adapters by path are a superuser's)",
       "--media-io-kwargs", "--mm-processor-kwargs", "--mm-processor-cache-gb",
       "--mm-processor-cache-type",
       "--mm-hasher-algorithm", "--mm-shm-cache-max-object-size-mb", "--mm-encoder-tp-mode",
       "--mm-encoder-attn-backend", "--mm-encoder-attn-dtype",
       "--mm-encoder-fp8-scale-save-margin", "--interleave-mm-strings", "--skip-mm-profiling",
       "--video-pruning-rate", "--video-pruning-method", "--mm-tensor-ipc",
       "--mm-processor-device", "--mm-ipc-gpu-memory-gb", "--mm-device-do-normalize",
       "--enable-lora", "--max-loras", "--max-lora-rank", "--lora-dtype",
       "--enable-tower-connector-lora", "--max-cpu-loras", "--fully-sharded-loras",
       "--lora-target-modules", "--specialize-active-lora", "--enable-mixed-moe-lora-format",
       "--enable-moe-shared-loras", "--max-lora-cls-labels")
_group(TUNING, "logs, metrics and timeouts",
       "--uvicorn-log-level", "--disable-uvicorn-access-log", "--log-level", "--log-error-stack",
       "--enable-log-outputs", "--enable-log-deltas", "--enable-per-request-metrics",
       "--enable-server-load-tracking", "--show-hidden-metrics-for-version",
       "--collect-detailed-traces", "--per-request-spec-decode-metrics", "--kv-cache-metrics",
       "--kv-cache-metrics-sample", "--custom-histogram-buckets", "--cudagraph-metrics",
       "--enable-layerwise-nvtx-tracing", "--enable-mfu-metrics",
       "--enable-logging-iteration-details", "--jit-monitor-mode", "--jit-monitor-verbose",
       "--disable-log-stats", "--aggregate-engine-logging", "--fail-on-environ-validation",
       "--shutdown-timeout", "--distributed-timeout-seconds",
       "--cpu-distributed-timeout-seconds", "--enable-fault-tolerance",
       "--fault-tolerance-config")


def counts() -> dict[FlagClass, int]:
    return {kind: sum(1 for c in CLASSES.values() if c is kind) for kind in FlagClass}
