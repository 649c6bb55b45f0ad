"""Tiny but well-formed model directories for the console tests, and a plan that passes its checks.

A directory has what inspection reads: config.json, a real safetensors file (header and data),
tokenizer files, a chat template and a generation config. Nothing here loads a model.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from console.catalog.models import BaseModel, Variant
from console.catalog.services import register_variant, reinspect
from console.checks.base import Outcome
from console.checks.plan import PlanView
from console.checks.suite import CHECKS
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.services import local_node
from tests.console.sockets import free_port

LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "dtype": "bfloat16",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "vocab_size": 32,
}
QUANTIZED_W8A8: dict[str, Any] = {"quantization_config": {
    "quant_method": "compressed-tensors", "format": "int-quantized",
    "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "int"},
                                  "input_activations": {"num_bits": 8, "type": "int"}}},
}}
QUANTIZED_W4A16: dict[str, Any] = {"quantization_config": {
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 64}}},
}}
# /proc/cpuinfo flags of an AVX2-only CPU and of an AVX-512 one, abridged: quant.kernel judges a
# node's W4A16 kernel by them, so tests that serve W4A16 pin one rather than read this machine's.
AVX2_FLAGS = ["avx", "avx2", "f16c", "fma", "sse4_2"]
AVX512_FLAGS = sorted([*AVX2_FLAGS, "avx512bw", "avx512dq", "avx512f", "avx512vl"])
TOKENIZER = {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
             "added_tokens": []}
TOKENIZER_CONFIG = {"bos_token": "<s>", "eos_token": "</s>", "model_max_length": 10**30}
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], fill: int = 0) -> bytes:
    """A valid safetensors file: ``{name: (dtype, shape)}``, every byte ``fill``."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I8": 1}
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        end = offset + count * sizes[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes([fill]) * offset


def write_model(path: Path, *, config: dict[str, Any] | None = None,
                generation_config: dict[str, Any] | None = None,
                chat_template: str | None = CHAT_TEMPLATE, tokenizer: dict[str, Any] | None = None,
                weights_fill: int = 0, dtype: str = "BF16") -> Path:
    """Write a tiny Llama directory at ``path`` and return it; keyword arguments vary one part."""
    path.mkdir(parents=True, exist_ok=True)
    config = {**LLAMA_CONFIG, **(config or {})}
    (path / "config.json").write_text(json.dumps(config))
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    (path / "model.safetensors").write_bytes(safetensors_bytes(
        {"model.embed_tokens.weight": (dtype, [vocab, hidden]),
         "model.norm.weight": (dtype, [hidden])}, fill=weights_fill))
    (path / "tokenizer.json").write_text(json.dumps(tokenizer or TOKENIZER))
    (path / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    if chat_template is not None:
        (path / "chat_template.jinja").write_text(chat_template)
    (path / "generation_config.json").write_text(json.dumps(
        generation_config if generation_config is not None else {"bos_token_id": 1}))
    return path



def make_startable(deployment: Deployment) -> Deployment:
    """Give the plan real (tiny) model files and ports nothing holds, so every check passes.

    The default plan's ports (8080, 8100, 8200) may be in use by a real deployment on the
    machine running the tests.
    """
    for variant in Variant.objects.filter(workers__deployment=deployment).distinct():
        write_model(Path(variant.path))
        reinspect(variant)
    for worker in deployment.workers.all():
        worker.port, worker.side_channel_port = free_port(), free_port()
        worker.save(update_fields=["port", "side_channel_port"])
    Deployment.objects.filter(pk=deployment.pk).update(router_port=free_port())
    deployment.refresh_from_db()
    return deployment


def register(base: BaseModel, root: Path, name: str, **model: Any) -> Variant:
    """Write a tiny model directory ``root/name`` (``model`` varies it) and register it."""
    return register_variant(base, name, str(write_model(root / name, **model)))


def make_plan(root: Path, name: str = "tiny-1p1d", variant: Variant | None = None,
              **fields: Any) -> Deployment:
    """A PD plan of a registered tiny model (``variant`` when given), one prefill and one decode
    on the local node, on free ports and the first and last core: it passes every check until a
    test changes it."""
    if variant is None:
        base, _ = BaseModel.objects.get_or_create(name="tiny")
        variant = (Variant.objects.filter(base=base, name="bf16").first()
                   or register(base, root, "bf16"))
    base = variant.base
    node = local_node()
    values: dict[str, Any] = {
        "base_model": base, "served_model_name": "tiny", "max_model_len": 2048,
        "longest_request": 1024, "kv_cache_gib": 1, "dtype": "bfloat16",
        "engine_version": node.engine_version, "sampling_defaults": {"temperature": 0},
        "router_port": free_port(), **fields,
    }
    deployment = Deployment.objects.create(name=name, **values)
    for role, core in (("prefill", node.cpu_ids[0]), ("decode", node.cpu_ids[-1])):
        WorkerPlan.objects.create(deployment=deployment, role=role, variant=variant, node=node,
                                  port=free_port(), side_channel_port=free_port(),
                                  cpu_cores=str(core))
    return deployment


def run(deployment: Deployment, check_id: str) -> Outcome:
    """One check on the plan as stored now."""
    deployment.refresh_from_db()
    return next(c for c in CHECKS if c.id == check_id)(PlanView.load(deployment))


def use_variant(deployment: Deployment, variant: Variant, role: str = "decode") -> None:
    deployment.workers.filter(role=role).update(variant=variant)


def running(deployment: Deployment) -> Deployment:
    """``deployment`` wanted running, as a start leaves it (without the supervisor's part)."""
    Deployment.objects.filter(pk=deployment.pk).update(
        desired_state=Deployment.DesiredState.RUNNING)
    deployment.refresh_from_db()
    return deployment
