"""The gateway process: the aiohttp app, its admin API and ``main()``.

    python -m inference.gateway --host 127.0.0.1 --port 8090 --config-file PATH

    POST /v1/...            to the router of the deployment the body's ``model`` names (forward.py)
    GET  /v1/models         what the caller's key may use
    GET  /health, /metrics
    PUT  /admin/config      a whole new configuration (config.py); GET answers its summary
    GET  /admin/queues      the queues of saturated deployments (flow_control.py)

The admin API is guarded by its own bearer token from ``PDSERVE_GATEWAY_ADMIN_TOKEN`` (never a
flag: ``ps`` shows argv), and is off while that is unset.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inference.gateway.config import GatewayConfig, Key, load_config_file, parse_config
from inference.gateway.flow_control import BAND_RANK, BANDS, DEFAULT_BAND, FlowControl
from inference.gateway.forward import Forwarder
from inference.gateway.metrics import GatewayMetrics, QueueCollector
from inference.gateway.routes import RouteTable
from inference.router.client_input import openai_errors, parse_json
from inference.router.errors import RequestError, error_response
from inference.router.keys import AuthFailure

log = logging.getLogger("pdserve.gateway")

ADMIN_TOKEN_ENV = "PDSERVE_GATEWAY_ADMIN_TOKEN"
CONFIG_PATH = "/admin/config"
QUEUES_PATH = "/admin/queues"
# A request's own priority band and fairness flow, for a key that may set them.
PRIORITY_HEADER = "X-Pdserve-Priority"
FLOW_HEADER = "X-Pdserve-Fairness-Id"
MAX_FLOW_CHARS = 64
ANONYMOUS_FLOW = "anonymous"


@dataclass(frozen=True)
class Settings:
    """The process's settings: the single source of the CLI's defaults."""

    host: str = "127.0.0.1"
    port: int = 8090
    config_file: str | None = None
    # As a router's default: a body a router takes must pass here too.
    max_body_bytes: int = 4 * 1024 * 1024
    admin_token: str | None = field(default=None, repr=False)


class Gateway:
    def __init__(self, config: GatewayConfig | None = None, admin_token: str | None = None,
                 max_body_bytes: int = Settings.max_body_bytes):
        self.metrics = GatewayMetrics.create()
        self.flows = FlowControl()
        self.metrics.registry.register(QueueCollector(self.flows))
        self.forwarder = Forwarder(self.metrics, self.flows)
        self.max_body_bytes = max_body_bytes
        self._admin_bearer = f"Bearer {admin_token}".encode() if admin_token else None
        self.table: RouteTable
        self.apply(config or GatewayConfig())

    def apply(self, config: GatewayConfig) -> None:
        """Serve with ``config`` from the next request on; requests in flight keep the table
        they started with."""
        self.table = RouteTable(config)
        self.flows.configure({d.name: d.max_concurrency for d in config.deployments},
                             config.queue.max_queue, config.queue.timeout_s)
        self.metrics.config_applied(config.version)
        log.info("configuration %s: %d deployments (%d with a router, %d open), %d aliases, %d keys%s",
                 config.version or "(no version)", len(config.deployments),
                 sum(d.router is not None for d in config.deployments), len(self.table.open),
                 len(config.aliases), len(config.keys),
                 ", a key required of every request" if config.require_key else "")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[openai_errors])
        app.on_startup.append(self.forwarder.open)
        app.on_cleanup.append(self.forwarder.close)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/{tail:.+}", self.infer)
        app.router.add_get(CONFIG_PATH, self.config_summary)
        app.router.add_put(CONFIG_PATH, self.replace_config)
        app.router.add_get(QUEUES_PATH, self.queues)
        return app

    # ---- the OpenAI API --------------------------------------------------------------
    async def infer(self, request: web.Request) -> web.StreamResponse:
        tail = request.match_info["tail"]
        if tail == "models" or tail.startswith("models/"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET"])
        # The path goes on to the router as sent: a '..' segment would climb out of its /v1
        # (to its admin API, say).
        if "." in tail and any(part in (".", "..") for part in tail.split("/")):
            raise web.HTTPNotFound()
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        # One table for the whole request, whatever PUT /admin/config does meanwhile.
        table = self.table
        # The key first: a refused key costs no reading and no parsing.
        try:
            scope, key = table.caller(request.headers.get("Authorization", ""))
        except AuthFailure as exc:
            self.metrics.answered("", "", 401)
            return self._unauthorized(exc, request_id)
        model: Any = None
        try:
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise RequestError(413, f"request body exceeds {self.max_body_bytes} bytes",
                                   param="body") from None
            body = _body(raw)
            model = body.get("model")
            if not isinstance(model, str):
                raise RequestError(400, "'model' is required: the name of a model (see GET /v1/models)",
                                   param="model")
            route, targets = table.targets(model, scope)
            band, flow = priority_of(request, key)
        except AuthFailure as exc:
            self.metrics.answered(model, "", 401)
            return self._unauthorized(exc, request_id)
        except RequestError as exc:
            known = isinstance(model, str) and model in table.routes
            self.metrics.answered(model if known else "", "", exc.status)
            return exc.response(request_id)
        return await self.forwarder.forward(request, raw, body, route, targets, request_id,
                                            band, flow)

    async def models(self, request: web.Request) -> web.Response:
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        table = self.table
        try:
            scope = table.scope(request.headers.get("Authorization", ""))
        except AuthFailure as exc:
            return self._unauthorized(exc, request_id)
        return web.json_response({"object": "list", "data": table.models(scope)},
                                 headers={"X-Request-Id": request_id})

    def _unauthorized(self, failure: AuthFailure, request_id: str) -> web.Response:
        self.metrics.auth_failures.labels(failure.reason).inc()
        return error_response(401, failure.message, request_id, code="invalid_api_key",
                              headers={"WWW-Authenticate": "Bearer"})

    # ---- plain endpoints -------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        config = self.table.config
        return web.json_response({"status": "ok", "config_version": config.version,
                                  "deployments": len(config.deployments),
                                  "aliases": len(config.aliases)})

    async def prometheus(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    # ---- the admin API ---------------------------------------------------------------
    def _admin_denied(self, request: web.Request) -> web.Response | None:
        if self._admin_bearer is None:
            return error_response(403, f"admin API disabled: set {ADMIN_TOKEN_ENV}",
                                  code="admin_disabled")
        supplied = request.headers.get("Authorization", "")
        if hmac.compare_digest(supplied.encode("utf-8", "surrogateescape"), self._admin_bearer):
            return None
        return error_response(401, "missing or invalid admin token (send 'Authorization: "
                              f"Bearer <{ADMIN_TOKEN_ENV}>')", code="invalid_admin_token",
                              headers={"WWW-Authenticate": "Bearer"})

    async def config_summary(self, request: web.Request) -> web.Response:
        if (denied := self._admin_denied(request)) is not None:
            return denied
        return web.json_response(_summary(self.table.config))

    async def queues(self, request: web.Request) -> web.Response:
        """Each queued deployment's requests in flight, its limit and who waits, by band and
        flow (the console's gateway page)."""
        if (denied := self._admin_denied(request)) is not None:
            return denied
        return web.json_response({"deployments": [
            {"deployment": name, "in_flight": stats.in_flight, "limit": stats.limit,
             "waiting": [{"band": band, "flow": flow, "requests": count}
                         for (band, flow), count in sorted(stats.waiting.items())],
             "in_flight_by_flow": [{"flow": flow, "requests": count}
                                   for flow, count in sorted(stats.holding.items())]}
            for name, stats in ((name, queue.stats()) for name, queue in self.flows.queues.items())]})

    async def replace_config(self, request: web.Request) -> web.Response:
        if (denied := self._admin_denied(request)) is not None:
            return denied
        try:
            # Parsed whole before it is applied: a refused one leaves the old one serving.
            config = parse_config(parse_json(await request.read()))
        except RequestError as exc:
            return exc.response()
        self.apply(config)
        return web.json_response(_summary(config))


def priority_of(request: web.Request, key: Key | None) -> tuple[str, str]:
    """The request's priority band and fairness flow: its key's (its team, or the key itself),
    or what its headers ask for where the key allows it, never above the key's own band.
    Raises RequestError (403, 400) naming the header."""
    band = key.priority if key is not None else DEFAULT_BAND
    flow = (key.team or f"key-{key.id}") if key is not None else ANONYMOUS_FLOW
    asked_band = request.headers.get(PRIORITY_HEADER)
    asked_flow = request.headers.get(FLOW_HEADER)
    if asked_band is None and asked_flow is None:
        return band, flow
    if key is None or not key.priority_header:
        raise RequestError(403, f"this key may not set {PRIORITY_HEADER} or {FLOW_HEADER}: the "
                                "console's key settings allow it", param=PRIORITY_HEADER
                           if asked_band is not None else FLOW_HEADER, code="permission_denied")
    if asked_band is not None:
        if asked_band not in BAND_RANK:
            raise RequestError(400, f"{PRIORITY_HEADER} must be one of {', '.join(BANDS)}",
                               param=PRIORITY_HEADER)
        if BAND_RANK[asked_band] < BAND_RANK[band]:
            raise RequestError(403, f"{PRIORITY_HEADER}: this key's highest band is {band!r}",
                               param=PRIORITY_HEADER, code="permission_denied")
        band = asked_band
    if asked_flow is not None:
        if not asked_flow or len(asked_flow) > MAX_FLOW_CHARS or not asked_flow.isprintable():
            raise RequestError(400, f"{FLOW_HEADER} must be 1 to {MAX_FLOW_CHARS} printable "
                                    "characters", param=FLOW_HEADER)
        flow = asked_flow
    return band, flow


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = parse_json(raw)
    except RequestError as exc:
        raise RequestError(400, exc.message, param="body") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object", param="body")
    return body


def _summary(config: GatewayConfig) -> dict[str, Any]:
    """What the admin API tells of a configuration: names and counts, never key hashes."""
    return {"version": config.version, "deployments": [d.name for d in config.deployments],
            "aliases": [a.name for a in config.aliases], "keys": len(config.keys)}


def build_parser() -> argparse.ArgumentParser:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog="python -m inference.gateway",
        description="One OpenAI-compatible endpoint in front of many deployments: each request\n"
                    "goes to the router of the deployment its 'model' names.",
        epilog=f"environment:\n  {ADMIN_TOKEN_ENV}\n      bearer token of the admin API "
               f"(GET/PUT {CONFIG_PATH}); unset, the admin API answers 403",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default=defaults.host, help="address to listen on")
    parser.add_argument("--port", type=int, default=defaults.port, help="port to listen on")
    parser.add_argument("--config-file", default=defaults.config_file, metavar="PATH",
                        help="JSON configuration to start with (deployments, aliases, keys); later "
                             f"ones arrive through PUT {CONFIG_PATH}. Without it every model is "
                             "unknown until then")
    parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes,
                        help="largest request body accepted; a larger one is answered with 413")
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port: must be from 1 to 65535, got {args.port}")
    if args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes: must be positive, got {args.max_body_bytes}")
    return Settings(host=args.host, port=args.port, config_file=args.config_file,
                    max_body_bytes=args.max_body_bytes,
                    admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
        config = load_config_file(settings.config_file) if settings.config_file else None
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    gateway = Gateway(config, settings.admin_token, settings.max_body_bytes)
    log.info("gateway on http://%s:%d, admin API %s", settings.host, settings.port,
             "on" if settings.admin_token else f"off (set {ADMIN_TOKEN_ENV})")
    web.run_app(gateway.app(), host=settings.host, port=settings.port, access_log=None,
                handler_cancellation=True, print=None, loop=uvloop.new_event_loop())
    return 0
