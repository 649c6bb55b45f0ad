"""A worker's key: the middleware every worker loads, the callers' auth, the environment's
allow-list (inference/worker_auth.py, inference/child_env.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from inference.child_env import child_environment, inherited
from inference.launch import WorkerSpec, build_command
from inference.worker_auth import MIDDLEWARE, WorkerKeyMiddleware, WorkerKeys, derive_key

KEY = "k" * 64


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _get(app: Any, path: str, headers: dict[str, str] | None = None) -> int:
    async def call() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            return (await client.get(path, headers=headers or {})).status_code
    return asyncio.run(call())


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize", "/detokenize", "/metrics",
                                  "/pooling", "/version", "/load", "/"])
def test_every_path_but_health_wants_the_key(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    app = WorkerKeyMiddleware(_ok)
    assert _get(app, path) == 401
    assert _get(app, path, {"Authorization": f"Bearer {KEY[:-1]}"}) == 401
    assert _get(app, path, {"Authorization": f"Basic {KEY}"}) == 401
    assert _get(app, path, {"Authorization": f"Bearer {KEY}"}) == 200
    assert _get(app, "/health") == 200


def test_without_a_key_in_its_environment_the_worker_is_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert _get(WorkerKeyMiddleware(_ok), "/tokenize") == 200


def test_every_worker_loads_the_middleware_and_its_key_is_never_on_the_command_line() -> None:
    argv, env = build_command(WorkerSpec(role="colocated", model_path="/m", served_model_name="m",
                                         port=8100, max_model_len=256))
    assert argv[argv.index("--middleware") + 1] == MIDDLEWARE
    assert "--api-key" not in argv and "VLLM_API_KEY" not in env


def test_callers_send_each_server_its_own_key() -> None:
    seen: dict[str, str | None] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        seen[str(request.url)] = request.headers.get("Authorization")
        return httpx.Response(200)

    auth = WorkerKeys({"http://127.0.0.1:8100": "a", "http://127.0.0.1:8200/": "b"})
    with httpx.Client(transport=httpx.MockTransport(answer), auth=auth) as client:
        for url in ("http://127.0.0.1:8100/tokenize", "http://127.0.0.1:8200/v1/models",
                    "http://127.0.0.1:8300/v1/models"):
            client.get(url)
    assert seen == {"http://127.0.0.1:8100/tokenize": "Bearer a",
                    "http://127.0.0.1:8200/v1/models": "Bearer b",
                    "http://127.0.0.1:8300/v1/models": None}


def test_keys_differ_by_purpose_and_name() -> None:
    keys = {derive_key("s", p, n) for p in ("worker", "requested-worker") for n in ("a", "b")}
    assert len(keys) == 4 and derive_key("s", "worker", "a") == derive_key("s", "worker", "a")


SECRETS = {
    "PDSERVE_SECRET_KEY": "poison-secret-key", "DATABASE_URL": "postgres://u:poison-db@h/d",
    "REDIS_URL": "redis://:poison-redis@h/0", "EMAIL_HOST_PASSWORD": "poison-mail",
    "PDSERVE_EMAIL_PASSWORD": "poison-mail-2", "DJANGO_SUPERUSER_PASSWORD": "poison-admin",
    "CELERY_BROKER_URL": "redis://:poison-celery@h/1", "PDSERVE_API_KEY": "poison-api-key",
    "PDSERVE_ROUTER_ADMIN_TOKEN": "poison-admin-token", "HF_TOKEN": "poison-hf",
    "HUGGING_FACE_HUB_TOKEN": "poison-hf-2", "VLLM_API_KEY": "poison-someone-elses-key",
    "AWS_SECRET_ACCESS_KEY": "poison-aws", "NCCL_IB_KEY": "poison-nccl",
}
NEEDED = {"PATH": "/usr/bin", "HOME": "/home/p", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
          "VIRTUAL_ENV": "/v", "HF_HOME": "/hf", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
          "UCX_TLS": "tcp", "NIXL_PLUGIN_DIR": "/n", "TORCHINDUCTOR_CACHE_DIR": "/i",
          "VLLM_CPU_KVCACHE_SPACE": "1", "CUDA_VISIBLE_DEVICES": "0", "LD_PRELOAD": "/t.so"}


def test_a_child_inherits_what_it_needs_and_none_of_the_secrets() -> None:
    env = child_environment({"VLLM_API_KEY": "its-own"}, parent={**SECRETS, **NEEDED})
    assert env == {**NEEDED, "VLLM_API_KEY": "its-own"}
    assert not any(inherited(name) for name in SECRETS)
