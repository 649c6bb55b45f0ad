"""The router's settings: one dataclass is the single source of defaults, and the CLI reads
its defaults from it."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields

from inference.kv_channels import CHANNEL_NAMES, uses_transfer_params
from inference.router.keys import load_key_file
from inference.router.policies import POLICY_NAMES
from inference.router.redis_client import parse_url

PD_POLICIES = ("remote", "pd_adaptive")


@dataclass(frozen=True)
class RouterConfig:
    served_model_name: str
    tokenizer_path: str
    max_model_len: int
    prefill_urls: tuple[str, ...] = ()
    decode_urls: tuple[str, ...] = ()
    # colocated mode: plain load balancing over full workers, no PD hand-off
    colocated_urls: tuple[str, ...] = ()
    kv_channel: str = "shared-storage"
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = field(default=None, repr=False)
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 2.0
    health_interval_s: float = 1.0
    max_body_bytes: int = 4 * 1024 * 1024
    # Prompts this short go straight to decode, which computes them itself: a KV channel moves
    # whole blocks only, so a prompt within one block has nothing worth a hand-off. 0: never.
    local_prefill_max_tokens: int = 0
    # Routing policy per role (see inference/router/policies/).
    prefill_policy: str = "least_outstanding"
    decode_policy: str = "least_outstanding"
    colocated_policy: str = "least_outstanding"
    # prefix_aware keys a prompt by its first `prefix_blocks` KV blocks of `prefix_block_size`
    # tokens. The block size should be the workers' (vLLM's CPU backend uses 128).
    prefix_block_size: int = 128
    prefix_blocks: int = 1
    # Where prompts are prefilled in PD mode: "remote" sends every prompt longer than
    # local_prefill_max_tokens through prefill; "pd_adaptive" decides per request
    # (inference/router/adaptive.py).
    pd_policy: str = "remote"
    # pd_adaptive: how long a decode worker's streams may pause for one prompt it prefills
    # itself; with the measured prefill speed this sets the longest prompt kept local.
    stall_budget_ms: float = 250.0
    # pd_adaptive: remote prefills in flight per prefill worker; more wait in the router's queue.
    prefill_slots: int = 1
    # Circuit breaker: this many failed calls in a row (5xx answers, refused or broken
    # connections) take a worker out for the cool-down, even if its /health still passes.
    breaker_failures: int = 5
    breaker_cooldown_s: float = 10.0
    # NIXL: before client traffic, hand off a prompt of this many tokens once per ready
    # prefill/decode pair, so no client request pays vLLM's lazy first handshake (see
    # inference/router/warmup.py); /health waits for one warm pair. 0: off.
    kv_warmup_tokens: int = 0
    # Bearer token of the admin API (/admin/*); None switches the admin API off.
    admin_token: str | None = field(default=None, repr=False)
    # Inference keys (hashes, scopes, limits) the console wrote; see inference/router/keys.py.
    keys_file: str | None = None
    # Per-key rate limits are shared through this Redis; in memory when unset.
    redis_url: str | None = field(default=None, repr=False)

    @property
    def mode(self) -> str:
        return "colocated" if self.colocated_urls else "pd"

    def validate(self) -> None:
        if self.colocated_urls and (self.prefill_urls or self.decode_urls):
            raise ValueError("--colocated cannot be combined with --prefill/--decode")
        if not self.colocated_urls and not (self.prefill_urls and self.decode_urls):
            raise ValueError("--prefill and --decode each need at least one URL (or use --colocated)")
        if self.kv_channel not in CHANNEL_NAMES:
            raise ValueError(f"--kv-channel: unknown channel {self.kv_channel!r}")
        if self.max_model_len <= 0:
            raise ValueError(f"--max-model-len: must be positive, got {self.max_model_len}")
        if self.local_prefill_max_tokens < 0:
            raise ValueError("--local-prefill-max-tokens: must be 0 or more")
        if self.kv_warmup_tokens:
            if self.kv_warmup_tokens < 0 or self.kv_warmup_tokens >= self.max_model_len:
                raise ValueError("--kv-warmup-tokens: must be 0 (off) or from 1 to "
                                 f"--max-model-len - 1 ({self.max_model_len - 1})")
            if self.mode != "pd" or not uses_transfer_params(self.kv_channel):
                raise ValueError("--kv-warmup-tokens: needs PD mode and a KV channel whose "
                                 "workers hand over transfer parameters (--kv-channel nixl)")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--port: {self.port} is outside 1-65535")
        for flag, policy in (("--prefill-policy", self.prefill_policy),
                             ("--decode-policy", self.decode_policy),
                             ("--colocated-policy", self.colocated_policy)):
            if policy not in POLICY_NAMES:
                raise ValueError(f"{flag}: unknown policy {policy!r} (one of {', '.join(POLICY_NAMES)})")
        if self.pd_policy not in PD_POLICIES:
            raise ValueError(f"--pd-policy: unknown {self.pd_policy!r} (one of {', '.join(PD_POLICIES)})")
        if self.stall_budget_ms <= 0:
            raise ValueError("--stall-budget-ms: must be positive")
        if self.breaker_failures < 1:
            raise ValueError("--breaker-failures: must be at least 1")
        if self.breaker_cooldown_s <= 0:
            raise ValueError("--breaker-cooldown: must be positive")
        if self.prefill_slots < 1:
            raise ValueError("--prefill-slots: must be at least 1")
        if self.prefix_block_size < 1:
            raise ValueError("--prefix-block-size: must be positive")
        if self.prefix_blocks < 1:
            raise ValueError("--prefix-blocks: must be positive")
        if self.admin_token is not None and self.admin_token == self.api_key:
            # Otherwise every inference client could reconfigure the pools.
            raise ValueError("PDSERVE_ROUTER_ADMIN_TOKEN must differ from PDSERVE_API_KEY")
        if self.keys_file is not None:
            load_key_file(self.keys_file)  # raises ValueError naming --keys-file
        if self.redis_url is not None:
            parse_url(self.redis_url)  # raises ValueError naming REDIS_URL


def _default(name: str) -> object:
    return next(f.default for f in fields(RouterConfig) if f.name == name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference.router",
        description="OpenAI-compatible router for prefill/decode disaggregated vLLM workers.",
    )
    parser.add_argument("--served-model-name", required=True, help="model name clients send")
    parser.add_argument("--tokenizer", required=True, dest="tokenizer_path",
                        help="model directory whose tokenizer checks prompt lengths")
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--prefill", action="append", default=[], metavar="URL",
                        help="prefill worker base URL (repeatable)")
    parser.add_argument("--decode", action="append", default=[], metavar="URL",
                        help="decode worker base URL (repeatable)")
    parser.add_argument("--colocated", action="append", default=[], metavar="URL",
                        help="full worker base URL for colocated mode (repeatable)")
    parser.add_argument("--kv-channel", choices=list(CHANNEL_NAMES), default=_default("kv_channel"))
    parser.add_argument("--host", default=_default("host"))
    parser.add_argument("--port", type=int, default=_default("port"))
    parser.add_argument("--request-timeout", type=float, dest="request_timeout_s",
                        default=_default("request_timeout_s"))
    parser.add_argument("--connect-timeout", type=float, dest="connect_timeout_s",
                        default=_default("connect_timeout_s"))
    parser.add_argument("--health-interval", type=float, dest="health_interval_s",
                        default=_default("health_interval_s"))
    parser.add_argument("--max-body-bytes", type=int, default=_default("max_body_bytes"))
    parser.add_argument("--local-prefill-max-tokens", type=int,
                        default=_default("local_prefill_max_tokens"),
                        help="prompts of at most this many tokens skip prefill and go straight "
                             "to decode (0: every prompt goes through prefill)")
    for role in ("prefill", "decode", "colocated"):
        parser.add_argument(f"--{role}-policy", choices=list(POLICY_NAMES),
                            default=_default(f"{role}_policy"),
                            help=f"how a {role} worker is chosen for each request")
    parser.add_argument("--pd-policy", choices=list(PD_POLICIES), default=_default("pd_policy"),
                        help="where prompts are prefilled: 'remote' (every prompt longer than "
                             "--local-prefill-max-tokens on a prefill worker) or 'pd_adaptive' "
                             "(decided per request from measured prefill speed and load)")
    parser.add_argument("--stall-budget-ms", type=float, default=_default("stall_budget_ms"),
                        help="pd_adaptive: the longest a decode worker's streams may pause for "
                             "a prompt it prefills itself")
    parser.add_argument("--prefill-slots", type=int, default=_default("prefill_slots"),
                        help="pd_adaptive: remote prefills in flight per prefill worker; the "
                             "rest wait in the router, shortest first with aging")
    parser.add_argument("--breaker-failures", type=int, default=_default("breaker_failures"),
                        help="failed calls in a row that take a worker out (circuit breaker)")
    parser.add_argument("--breaker-cooldown", type=float, dest="breaker_cooldown_s",
                        default=_default("breaker_cooldown_s"),
                        help="seconds an open breaker keeps a worker out before probing it again")
    parser.add_argument("--prefix-block-size", type=int, default=_default("prefix_block_size"),
                        help="KV block size of the workers, in tokens (for prefix_aware)")
    parser.add_argument("--prefix-blocks", type=int, default=_default("prefix_blocks"),
                        help="prefix_aware routes by a hash of this many whole blocks of the prompt")
    parser.add_argument("--kv-warmup-tokens", type=int, default=_default("kv_warmup_tokens"),
                        help="NIXL: hand off a prompt of this many tokens once per prefill/decode "
                             "pair before serving, so that no client request pays the first "
                             "handshake; /health waits for one warm pair (0: off)")
    parser.add_argument("--keys-file", default=_default("keys_file"),
                        help="JSON file of the inference keys (hashes, states, limits) the console "
                             "writes; later changes arrive through PUT /admin/keys")
    return parser


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    config = RouterConfig(
        served_model_name=args.served_model_name,
        tokenizer_path=args.tokenizer_path,
        max_model_len=args.max_model_len,
        prefill_urls=tuple(u.rstrip("/") for u in args.prefill),
        decode_urls=tuple(u.rstrip("/") for u in args.decode),
        colocated_urls=tuple(u.rstrip("/") for u in args.colocated),
        kv_channel=args.kv_channel,
        host=args.host,
        port=args.port,
        # The key comes from the environment, never argv: argv is visible in `ps`.
        api_key=os.environ.get("PDSERVE_API_KEY") or None,
        request_timeout_s=args.request_timeout_s,
        connect_timeout_s=args.connect_timeout_s,
        health_interval_s=args.health_interval_s,
        max_body_bytes=args.max_body_bytes,
        local_prefill_max_tokens=args.local_prefill_max_tokens,
        prefill_policy=args.prefill_policy,
        decode_policy=args.decode_policy,
        colocated_policy=args.colocated_policy,
        pd_policy=args.pd_policy,
        stall_budget_ms=args.stall_budget_ms,
        prefill_slots=args.prefill_slots,
        breaker_failures=args.breaker_failures,
        breaker_cooldown_s=args.breaker_cooldown_s,
        prefix_block_size=args.prefix_block_size,
        prefix_blocks=args.prefix_blocks,
        kv_warmup_tokens=args.kv_warmup_tokens,
        admin_token=os.environ.get("PDSERVE_ROUTER_ADMIN_TOKEN") or None,
        keys_file=args.keys_file,
        redis_url=os.environ.get("REDIS_URL") or None,
    )
    config.validate()
    return config
