"""Measuring one server's prefill and decode speed (inference/variant_speed.py), against a stub
OpenAI server whose first completion is slow, as a freshly started vLLM's is: something vLLM
cannot be made to do on demand, and what once failed a measurement ("8 tokens in 0.057 s
against 0.081 s for one")."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inference.output_gate import GateError
from inference.variant_speed import measure

COLD_S = 0.3  # the first completion
STEP_S = 0.004  # each token after it


class ColdStartServer(BaseHTTPRequestHandler):
    completions = 0

    def log_message(self, *_args: object) -> None:
        pass

    def _json(self, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json({"data": [{"id": "stub"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self._json({"tokens": list(range(1, 40))})
            return
        type(self).completions += 1
        tokens = int(body["max_tokens"])
        time.sleep(COLD_S if type(self).completions == 1 else STEP_S * tokens)
        self._json({"choices": [{"text": "x"}], "usage": {"completion_tokens": tokens}})


@pytest.fixture
def cold_server() -> Iterator[str]:
    ColdStartServer.completions = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), ColdStartServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_slow_first_request_is_a_warm_up_not_a_measurement(cold_server: str) -> None:
    speed = measure(cold_server, prefill_tokens=16, decode_tokens=64)
    # 63 extra tokens at STEP_S each; the cold first request is in neither figure.
    assert speed.decode_tps == pytest.approx(1 / STEP_S, rel=0.5)
    assert speed.prefill_ms < COLD_S * 1000
    assert ColdStartServer.completions == 1 + 4 + 2  # warm-up, prefill (1 + 3), decode (2)


def test_a_decode_that_is_not_slower_than_one_token_is_refused(cold_server: str) -> None:
    # decode_tokens=1: no extra tokens to time; the measurement says why it cannot be made.
    with pytest.raises(GateError, match="1 tokens in"):
        measure(cold_server, prefill_tokens=16, decode_tokens=1)
