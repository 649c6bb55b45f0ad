"""The router process: its parts wired into one aiohttp app, /health and /metrics, and main().

    python -m inference.router --served-model-name smollm2 --tokenizer MODEL_DIR \
        --max-model-len 2048 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200

Read top-down from here: request_path.py (an inference request, from its key to its timeline
line), dispatch.py (where it goes inside its revision group), forward.py and handoff.py (the
worker calls), registry.py (the groups and workers at run time), admin.py (the admin API).
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inference.router import logs
from inference.router.admin import AdminAPI
from inference.router.admission import Admission
from inference.router.budgets import BudgetMeter
from inference.router.client_input import openai_errors
from inference.router.config import RouterConfig, build_parser, config_from_args
from inference.router.dispatch import Dispatcher
from inference.router.groups import WarmupPrompt, report_state
from inference.router.keys import Gatekeeper, load_key_file
from inference.router.media import MediaGate
from inference.router.metrics import RouterMetrics
from inference.router.pass_through import PassThrough
from inference.router.prompts import CharsPerToken, PromptChecker
from inference.router.ratelimit import RateLimiter
from inference.router.registry import Registry
from inference.router.request_path import RequestPath
from inference.router.tokenizing import Tokenizing, default_threads
from inference.router.torchless import without_torch
from inference.router.usage import UsageLedger
from inference.router.warmup import FILLER, warmup_prompt

log = logging.getLogger("pdserve.router")


class Router:
    def __init__(self, config: RouterConfig, checker: PromptChecker):
        self.config = config
        self.checker = checker
        self.metrics = RouterMetrics.create()
        self.usage = UsageLedger(config.usage_file)
        # The budgets count with the ledger's clock, so that both agree on the day.
        self.budgets = BudgetMeter(clock=lambda: self.usage.clock())
        self.gate = Gatekeeper(
            load_key_file(config.keys_file, config.served_model_name) if config.keys_file
            else None, legacy_key=config.api_key, model=config.served_model_name,
            on_replace=self.budgets.keys_changed)
        self.budgets.keys_changed(self.gate.key_set)
        self.budgets.load(self.usage.token_totals(self.budgets.month_start()))
        # A PD request makes two worker calls, each within the request timeout; a lease
        # outliving both belongs to a replica that died.
        self.limiter = RateLimiter(config.redis_url, lease_ttl_s=2 * config.request_timeout_s + 30,
                                   on_store_error=self.metrics.rate_limit_store_errors.inc)
        self.media = MediaGate(config, self.metrics)
        self.tokenizing = Tokenizing(config.tokenize_threads or default_threads(),
                                     config.tokenize_queue)
        self.admission = Admission(self.gate, self.limiter, self.metrics, self.tokenizing,
                                   CharsPerToken(), self.budgets)
        warmup = None
        if config.kv_warmup_tokens:
            warmup = WarmupPrompt(
                warmup_prompt(checker.encode(FILLER, False), config.kv_warmup_tokens),
                vocab_size=len(checker.tokenizer))
        self.registry = Registry(config, self.metrics, warmup)
        dispatcher = Dispatcher(config, self.metrics)
        self.requests = RequestPath(config, checker, self.metrics, self.admission, self.limiter,
                                    self.tokenizing, self.media, self.usage, self.budgets,
                                    self.registry, dispatcher)
        self.pass_through = PassThrough(config, self.metrics, self.admission, self.limiter,
                                        self.media, self.registry, dispatcher)

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self, _app: web.Application) -> None:
        self.registry.open()
        self.usage.start()

    async def stop(self, _app: web.Application) -> None:
        try:
            await self.registry.close()
            await self.limiter.close()
            self.tokenizing.close()
        finally:
            # Requests have all ended when the app's cleanup runs: what they metered is written
            # now, whatever else failed to close.
            await self.usage.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[openai_errors])
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_post("/v1/chat/completions", self.requests.chat)
        app.router.add_post("/v1/completions", self.requests.completions)
        self.pass_through.add_routes(app)
        AdminAPI(self.registry, self.gate, self.budgets, self.config.admin_token,
                 self.usage).add_routes(app)
        return app

    # ---- the router's own state ------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        groups = {
            revision: {**group.health(), "weight": group.weight,
                       "state": group.state}
            for revision, group in self.registry.groups.items()
        }
        routable = [groups[g.revision] for g in self.registry.groups.values() if g.routable]
        primary = groups[self.registry.primary.revision]
        # The top level is the primary group's, as it was with one set of pools; the status is
        # the best any group that takes requests can do.
        answer: dict[str, object] = {"mode": primary["mode"], "roles": primary["roles"]}
        if "kv_warmup" in primary:
            answer["kv_warmup"] = primary["kv_warmup"]
        degraded = next((g for g in routable if g["status"] == "degraded"), None)
        if any(g["status"] == "ok" for g in routable):
            status = "ok"
        elif degraded is not None:
            status = "degraded"
            answer["degraded"] = degraded["degraded"]
        else:
            status = "unavailable"
        answer["status"] = status
        answer["groups"] = groups
        return web.json_response(answer, status=503 if status == "unavailable" else 200)

    async def prometheus(self, _request: web.Request) -> web.Response:
        report_state(self.metrics, self.registry.groups.values())
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logs.configure()
    without_torch()
    checker = PromptChecker(
        config.tokenizer_path, config.served_model_name, config.max_model_len,
        Path(config.chat_template).read_text(encoding="utf-8") if config.chat_template else None)
    router = Router(config, checker)
    # Loading the tokenizer imports transformers: long-lived objects that every full
    # collection would walk again, pausing all requests (~0.4 s at a time while torch came
    # with it). Freezing them leaves the collector only what requests allocate.
    gc.collect()
    gc.freeze()
    log.info("router on http://%s:%d mode=%s channel=%s", config.host, config.port, config.mode,
             config.kv_channel)
    # uvloop (a dependency of uvicorn[standard]): ~10 % less CPU per request than asyncio's loop.
    web.run_app(router.app(), host=config.host, port=config.port, access_log=None,
                handler_cancellation=True, print=None, loop=uvloop.new_event_loop())
    # Frozen objects are skipped by the collection at interpreter exit too: unfrozen, they are
    # finalized there as usual.
    gc.unfreeze()
    return 0
