"""A quiet ``http.server`` handler that answers JSON: the base of the tests' small stand-in
servers (a router's admin API, a vLLM worker, a stale prefill)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    def log_message(self, *_args: object) -> None:
        return None

    def send_bytes(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def send_json(self, status: int, body: dict[str, Any]) -> None:
        self.send_bytes(status, json.dumps(body).encode())
