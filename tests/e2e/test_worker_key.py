"""A real (tiny) vLLM worker refuses callers without its key on every path but /health, and
reads none of its starter's secrets in its environment (inference/worker_auth.py,
inference/child_env.py).

The worker is the borrowed deployment's decode (tests/borrowed.py), started by the supervisor
as every worker is: its key derived from the console's secret key, its environment built from
the supervisor's through the allow-list. The supervisor's environment holds the console's
secret key (in its data directory) and the starter secrets the borrowed console is given.
(A worker of its own cost this test a vLLM start; the allow-list's refusal of DATABASE_URL and
REDIS_URL, which the borrowed console runs without, is tests/console/test_child_env.py's.)
"""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest

from tests.borrowed import STARTER_SECRETS, Handle

pytestmark = pytest.mark.vllm


def decode_url(borrowed: Handle) -> str:
    [decode] = [w for w in borrowed.deployment()["workers"] if w["slot"] == "decode-0"]
    return f"http://127.0.0.1:{decode['port']}"


def calls(model: str) -> list[tuple[str, str, dict[str, object] | None]]:
    return [("POST", "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 2}),
            ("POST", "/v1/chat/completions",
             {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}),
            ("GET", "/v1/models", None),
            ("POST", "/tokenize", {"model": model, "prompt": "Hello"}),
            ("POST", "/detokenize", {"model": model, "tokens": [1, 2]}),
            ("GET", "/metrics", None),
            ("GET", "/version", None)]


def test_without_its_key_a_worker_answers_401_and_with_it_200(borrowed: Handle) -> None:
    url, key = decode_url(borrowed), borrowed.worker_headers()
    for method, path, body in calls(borrowed.served_model_name):
        for headers in ({}, {"Authorization": "Bearer wrong"},
                        {"Authorization": key["Authorization"] + "x"}):
            refused = httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=60)
            assert refused.status_code == 401, (path, headers, refused.text)
        answered = httpx.request(method, f"{url}{path}", json=body, headers=key, timeout=60)
        assert answered.status_code == 200, (path, answered.text)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200  # no key needed


def test_the_worker_and_its_engine_read_none_of_the_starters_secrets(borrowed: Handle) -> None:
    pid = borrowed.processes()["decode-0"]["pid"]
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    assert len(tree) >= 2  # the API server and its engine core
    secret_key = (borrowed.data_dir / "secret_key").read_text().strip()
    key = borrowed.worker_headers()["Authorization"].removeprefix("Bearer ")
    secrets = [secret_key, *STARTER_SECRETS.values()]
    for process in tree:
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().decode(errors="replace")
        assert not [v for v in secrets if v in environ], process.name()
        assert key not in " ".join(process.cmdline())
    # The key itself is in the API server's environment, where the middleware reads it.
    assert f"VLLM_API_KEY={key}" in Path(f"/proc/{pid}/environ").read_bytes().decode(
        errors="replace")
