"""The router's settings: one dataclass is the single source of defaults, help texts, flags and
bounds; the CLI parser, the reading of argv and the environment, and the checks are made from it."""

from __future__ import annotations

import argparse
import os
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from inference.kv_channels import CHANNEL_NAMES, uses_transfer_params
from inference.router.keys import load_key_file
from inference.router.policies import POLICY_NAMES
from inference.router.redis_client import parse_url
from inference.router.usage import check_usage_file

PD_POLICIES = ("remote", "pd_adaptive")
SETTING = "setting"


@dataclass(frozen=True)
class Setting:
    """How one RouterConfig field is read and checked (kept in the field's metadata)."""

    help: str
    flag: str | None = None  # when not --<field name with dashes>
    # Read from this environment variable instead of argv, which anyone can see in `ps`.
    env: str | None = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False
    urls: bool = False  # a repeatable flag, one worker base URL each
    check: Callable[[Any], object] | None = None  # raises a ValueError that names the setting
    many: str | None = None  # a repeatable flag whose values are kept as given: their metavar

    def name(self, field_name: str) -> str:
        """The flag or environment variable the field is read from, which its error messages name."""
        return self.env or self.flag or "--" + field_name.replace("_", "-")

    def check_value(self, field_name: str, value: Any) -> None:
        name = self.name(field_name)
        if self.choices and value not in self.choices:
            raise ValueError(f"{name}: unknown {value!r} (one of {', '.join(self.choices)})")
        if self.positive and value <= 0:
            raise ValueError(f"{name}: must be positive, got {value}")
        if ((self.minimum is not None and value < self.minimum)
                or (self.maximum is not None and value > self.maximum)):
            bounds = [f"{word} {bound}" for word, bound in (("at least", self.minimum),
                                                            ("at most", self.maximum)) if bound is not None]
            raise ValueError(f"{name}: must be {' and '.join(bounds)}, got {value}")
        if self.check is not None and value is not None:
            self.check(value)


def setting(help: str, *, flag: str | None = None, env: str | None = None,
            choices: tuple[str, ...] = (), minimum: float | None = None, maximum: float | None = None,
            positive: bool = False, urls: bool = False,
            check: Callable[[Any], object] | None = None,
            many: str | None = None) -> Mapping[str, Setting]:
    """A field's metadata; given to `dataclasses.field` itself, so type checkers still see which
    fields are required."""
    return {SETTING: Setting(help, flag, env, choices, minimum, maximum, positive, urls, check,
                             many)}


# A revision group's label: it names the group in URLs, headers and metric labels.
REVISION_LABEL = re.compile(r"[A-Za-z0-9._-]{1,32}")


def revision_label(value: str) -> str:
    if not REVISION_LABEL.fullmatch(value):
        raise ValueError(f"--revision: {value!r} is not a label of 1 to 32 letters, digits, '.', '_' "
                         "or '-'")
    return value


def _readable_template(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--chat-template: cannot read {path}: {exc}") from None


def _media_dirs(paths: tuple[str, ...]) -> None:
    # Checked at start: a typo would otherwise surface as every file URL refused.
    for path in paths:
        if not Path(path).is_dir():
            raise ValueError(f"--media-path: {path} is not a directory")


def _media_domains(hosts: tuple[str, ...]) -> None:
    for host in hosts:
        try:
            parsed = urlsplit("//" + host).hostname
        except ValueError:
            parsed = None
        # A scheme, port or path would never equal a URL's host name: it would allow nothing.
        if not host or parsed != host.lower():
            raise ValueError(f"--media-domain: {host!r} is not a bare host name (no scheme, "
                             "port or path)")


@dataclass(frozen=True)
class RouterConfig:
    served_model_name: str = field(metadata=setting("model name clients send"))
    tokenizer_path: str = field(metadata=setting(
        "model directory whose tokenizer checks prompt lengths", flag="--tokenizer"))
    max_model_len: int = field(metadata=setting(
        "the workers' context length: prompt plus completion, in tokens", positive=True))
    prefill_urls: tuple[str, ...] = field(default=(), metadata=setting(
        "prefill worker base URL (repeatable)", flag="--prefill", urls=True))
    decode_urls: tuple[str, ...] = field(default=(), metadata=setting(
        "decode worker base URL (repeatable)", flag="--decode", urls=True))
    # colocated mode: plain load balancing over full workers, no PD hand-off
    colocated_urls: tuple[str, ...] = field(default=(), metadata=setting(
        "full worker base URL for colocated mode (repeatable)", flag="--colocated", urls=True))
    revision: str = field(default="1", metadata=setting(
        "label of the revision group the --prefill/--decode/--colocated workers form at start "
        "(weight 100); more groups arrive through POST /admin/groups", check=revision_label))
    kv_channel: str = field(default="shared-storage", metadata=setting(
        "how prefill workers hand KV to decode workers; the workers' KV connector",
        choices=CHANNEL_NAMES))
    host: str = field(default="127.0.0.1", metadata=setting("address to listen on"))
    port: int = field(default=8080, metadata=setting("port to listen on", minimum=1, maximum=65535))
    api_key: str | None = field(default=None, repr=False, metadata=setting(
        "a single inference key, accepted besides those of --keys-file", env="PDSERVE_API_KEY"))
    request_timeout_s: float = field(default=600.0, metadata=setting(
        "seconds a request may take from its arrival, then it is answered with 504",
        flag="--request-timeout"))
    connect_timeout_s: float = field(default=2.0, metadata=setting(
        "seconds to wait for a connection to a worker", flag="--connect-timeout"))
    health_interval_s: float = field(default=1.0, metadata=setting(
        "seconds between two health probes of a worker", flag="--health-interval"))
    chat_template: str | None = field(default=None, metadata=setting(
        "Jinja chat template file the workers were started with (their --chat-template), which "
        "the router then renders chat prompts with instead of the model's own",
        check=_readable_template))
    max_body_bytes: int = field(default=4 * 1024 * 1024, metadata=setting(
        "largest request body accepted; a larger one is answered with 413"))
    tokenize_threads: int = field(default=0, metadata=setting(
        "long prompts the router tokenizes at once, each in a thread off its event loop (0: one "
        "per core it may run on)", minimum=0))
    tokenize_queue: int = field(default=64, metadata=setting(
        "requests that may wait for a tokenizing thread; past that a request is answered 503 "
        "tokenizer_busy with Retry-After", minimum=0))
    # A KV channel moves whole blocks only, so a prompt within one block has nothing worth a hand-off.
    local_prefill_max_tokens: int = field(default=0, metadata=setting(
        "prompts of at most this many tokens skip prefill and go straight to decode (0: every prompt "
        "goes through prefill)", minimum=0))
    prefill_policy: str = field(default="least_outstanding", metadata=setting(
        "how a prefill worker is chosen for each request", choices=POLICY_NAMES))
    decode_policy: str = field(default="least_outstanding", metadata=setting(
        "how a decode worker is chosen for each request", choices=POLICY_NAMES))
    colocated_policy: str = field(default="least_outstanding", metadata=setting(
        "how a colocated worker is chosen for each request", choices=POLICY_NAMES))
    pd_policy: str = field(default="remote", metadata=setting(
        "where prompts are prefilled: 'remote' (every prompt longer than --local-prefill-max-tokens "
        "on a prefill worker) or 'pd_adaptive' (decided per request from measured prefill speed and "
        "load, see inference/router/adaptive.py)", choices=PD_POLICIES))
    # With the measured prefill speed, the budget sets the longest prompt kept on decode.
    stall_budget_ms: float = field(default=250.0, metadata=setting(
        "pd_adaptive: the longest a decode worker's streams may pause for a prompt it prefills itself",
        positive=True))
    degraded_mode: bool = field(default=True, metadata=setting(
        "PD mode: while no prefill worker is ready, decode prefills prompts itself, and while no "
        "decode worker is ready, prefill runs whole requests; this flag turns that off, and such "
        "requests are answered 503", flag="--no-degraded-mode"))
    prefill_slots: int = field(default=1, metadata=setting(
        "pd_adaptive: remote prefills in flight per prefill worker; the rest wait in the router, "
        "shortest first with aging", minimum=1))
    # Failed calls count even while the worker's /health still passes.
    breaker_failures: int = field(default=5, metadata=setting(
        "failed calls in a row (5xx answers, refused or broken connections) that take a worker out "
        "(circuit breaker)", minimum=1))
    breaker_cooldown_s: float = field(default=10.0, metadata=setting(
        "seconds an open breaker keeps a worker out before probing it again", flag="--breaker-cooldown",
        positive=True))
    # vLLM's CPU backend uses blocks of 128 tokens.
    prefix_block_size: int = field(default=128, metadata=setting(
        "KV block size of the workers, in tokens (for prefix_aware)", positive=True))
    prefix_blocks: int = field(default=1, metadata=setting(
        "prefix_aware routes by a hash of this many whole blocks of the prompt", positive=True))
    # Without it the first client request on each pair pays vLLM's lazy NIXL handshake
    # (see inference/router/warmup.py). Its bounds depend on max_model_len: checked in validate.
    kv_warmup_tokens: int = field(default=0, metadata=setting(
        "NIXL: hand off a prompt of this many tokens once per prefill/decode pair before serving, so "
        "that no client request pays the first handshake; /health waits for one warm pair (0: off)"))
    # vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT: after it the prefill worker frees blocks that
    # no decode pulled, so a drain need not wait longer for them.
    kv_lease_s: float = field(default=480.0, metadata=setting(
        "seconds a drained prefill worker is kept open for decode to pull the KV it announced",
        flag="--kv-lease-s", positive=True))
    admin_token: str | None = field(default=None, repr=False, metadata=setting(
        "bearer token of the admin API (/admin/*); unset, the admin API is off",
        env="PDSERVE_ROUTER_ADMIN_TOKEN"))
    worker_key: str | None = field(default=None, repr=False, metadata=setting(
        "key the workers refuse callers without (sent as a bearer token on every call to them, "
        "/health probes included); unset, none is sent", env="PDSERVE_WORKER_KEY"))
    keys_file: str | None = field(default=None, metadata=setting(
        "JSON file of the inference keys (hashes, states, limits) the console writes; later changes "
        "arrive through PUT /admin/keys", check=load_key_file))
    redis_url: str | None = field(default=None, repr=False, metadata=setting(
        "Redis that shares the per-key rate limits between routers; unset, they are kept in memory",
        env="REDIS_URL", check=parse_url))
    usage_file: str | None = field(default=None, metadata=setting(
        "SQLite file of the usage ledger: requests, errors, tokens and latency per UTC day and API "
        "key, read through GET /admin/usage (created with its directory if missing, mode 0600); "
        "unset, the ledger is kept in memory and lost when the router stops",
        check=check_usage_file))
    # Images (media.py): checked, and file or remote ones inlined, before any worker is called.
    max_images: int = field(default=0, metadata=setting(
        "image parts a chat request may hold, all its messages together (0: the model takes no "
        "images, and a request with one is answered 400)", minimum=0))
    max_image_bytes: int = field(default=2 * 1024 * 1024, metadata=setting(
        "largest image, in bytes once decoded (a data URL's base64, a file, a fetched body)",
        positive=True))
    # A tiny compressed file can claim a huge canvas; its header is read before any pixel.
    max_image_pixels: int = field(default=4096 * 4096, metadata=setting(
        "largest image in pixels (width x height, read from its header before any pixel is "
        "decoded)", positive=True))
    media_paths: tuple[str, ...] = field(default=(), metadata=setting(
        "directory whose files a request may name by file:// URL (repeatable; symlinks are "
        "resolved and the file must lie inside); none given, file URLs are refused",
        flag="--media-path", many="DIR", check=_media_dirs))
    media_domains: tuple[str, ...] = field(default=(), metadata=setting(
        "host name whose http(s) image URLs the router fetches (repeatable; exact match, no "
        "redirects followed); none given, remote image URLs are refused",
        flag="--media-domain", many="HOST", check=_media_domains))
    media_fetch_timeout_s: float = field(default=10.0, metadata=setting(
        "seconds the router gives a remote image, from connecting to its last byte",
        flag="--media-fetch-timeout", positive=True))

    @property
    def mode(self) -> str:
        """The mode of the group the start-up workers form."""
        return "colocated" if self.colocated_urls else "pd"

    def start_urls(self) -> dict[str, tuple[str, ...]]:
        """The start-up group's workers by role."""
        if self.mode == "colocated":
            return {"colocated": self.colocated_urls}
        return {"prefill": self.prefill_urls, "decode": self.decode_urls}

    def validate(self) -> None:
        for f, spec in settings():
            spec.check_value(f.name, getattr(self, f.name))
        if self.colocated_urls and (self.prefill_urls or self.decode_urls):
            raise ValueError("--colocated cannot be combined with --prefill/--decode")
        if not self.colocated_urls and not (self.prefill_urls and self.decode_urls):
            raise ValueError("--prefill and --decode each need at least one URL (or use --colocated)")
        if self.kv_warmup_tokens:
            if self.kv_warmup_tokens < 0 or self.kv_warmup_tokens >= self.max_model_len:
                raise ValueError("--kv-warmup-tokens: must be 0 (off) or from 1 to "
                                 f"--max-model-len - 1 ({self.max_model_len - 1})")
            if self.mode != "pd" or not uses_transfer_params(self.kv_channel):
                raise ValueError("--kv-warmup-tokens: needs PD mode and a KV channel whose "
                                 "workers hand over transfer parameters (--kv-channel nixl)")
        if self.admin_token is not None and self.admin_token == self.api_key:
            # Otherwise every inference client could reconfigure the pools.
            raise ValueError("PDSERVE_ROUTER_ADMIN_TOKEN must differ from PDSERVE_API_KEY")


def settings() -> list[tuple[Field[Any], Setting]]:
    """RouterConfig's fields, each with how it is read and checked."""
    return [(f, f.metadata[SETTING]) for f in fields(RouterConfig)]


def _environment_help() -> str:
    """The settings read from the environment, for the end of --help."""
    lines = ["environment:"]
    for spec in (spec for _, spec in settings() if spec.env):
        lines += [f"  {spec.env}", textwrap.fill(spec.help, 80, initial_indent=" " * 6,
                                                subsequent_indent=" " * 6)]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference.router",
        description="OpenAI-compatible router for prefill/decode disaggregated vLLM workers.",
        epilog=_environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    types = get_type_hints(RouterConfig)
    for f, spec in settings():
        if spec.env:
            continue
        if spec.urls or spec.many:
            parser.add_argument(spec.name(f.name), dest=f.name, action="append", default=[],
                                metavar=spec.many or "URL", help=spec.help)
            continue
        if types[f.name] is bool:
            # A switch that sets the field to the opposite of its default.
            parser.add_argument(spec.name(f.name), dest=f.name, help=spec.help, default=f.default,
                                action="store_false" if f.default else "store_true")
            continue
        required = f.default is MISSING
        parser.add_argument(spec.name(f.name), dest=f.name, help=spec.help, required=required,
                            default=None if required else f.default,
                            type=types[f.name] if types[f.name] in (int, float) else None,
                            choices=list(spec.choices) or None)
    return parser


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    values: dict[str, Any] = {}
    for f, spec in settings():
        if spec.env:
            values[f.name] = os.environ.get(spec.env) or None
        elif spec.urls:
            values[f.name] = tuple(url.rstrip("/") for url in getattr(args, f.name))
        elif spec.many:
            values[f.name] = tuple(getattr(args, f.name))
        else:
            values[f.name] = getattr(args, f.name)
    config = RouterConfig(**values)
    config.validate()
    return config
