"""A router process loads its tokenizer and chat template without torch (torchless.py):
torch was most of a router's start and memory. A real `python -m inference.router` process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.console.sockets import free_port
from tests.unit.conftest import MODEL

REPO = Path(__file__).resolve().parents[2]


def test_a_router_process_checks_chat_prompts_with_no_torch_loaded(tokenizer_dir: Path,
                                                                    tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        router = subprocess.Popen(
            [sys.executable, "-m", "inference.router", "--served-model-name", MODEL,
             "--tokenizer", str(tokenizer_dir), "--max-model-len", "64", "--port", str(port),
             "--colocated", f"http://127.0.0.1:{free_port()}"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert router.poll() is None, log.read_text()
            try:
                # No worker answers: 503, but the router is up with its tokenizer loaded.
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        # The chat template rendered and its tokens counted by the router itself: too long for
        # the 64-token model, refused before any worker is asked.
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=10, json={
            "model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hello world " * 40}]})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "messages"
        maps = Path(f"/proc/{router.pid}/maps").read_text()
        assert "tokenizers" in maps  # the Rust tokenizer library is what it runs on
        assert "libtorch" not in maps
    finally:
        router.kill()
        router.wait()
