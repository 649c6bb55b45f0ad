"""A stand-in NIXL prefill worker that announces KV blocks nobody holds."""

from __future__ import annotations

import json
from http.server import ThreadingHTTPServer
from pathlib import Path

from tests.json_handler import JsonHandler


class StaleHandoffPrefill(ThreadingHTTPServer):
    """A stand-in prefill worker, for a fault vLLM cannot be made to produce on demand: it
    answers like NIXL's prefill but announces KV blocks nobody holds (an expired lease, a
    restarted prefill), so the real decode worker's KV load fails."""

    def __init__(self, port: int, tokenizer_dir: Path, side_port: int):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        # A real prefill's NIXL side channel, so the handshake is reached and then fails.
        self.side_port = side_port
        super().__init__(("127.0.0.1", port), _StaleHandler)


class _StaleHandler(JsonHandler):
    server: StaleHandoffPrefill

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_json(200, {})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = self.server.tokenizer(body["prompt"])["input_ids"]
        self.send_json(200, {
            "id": "cmpl-stale", "object": "text_completion", "model": body["model"],
            "choices": [{"index": 0, "text": "", "finish_reason": "length",
                         "prompt_token_ids": ids}],
            "kv_transfer_params": {
                "do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": [list(range(1, len(ids) // 128 + 1))],
                "remote_engine_id": "stale-engine", "remote_request_id": "cmpl-stale-0",
                "remote_host": "127.0.0.1", "remote_port": self.server.side_port, "tp_size": 1,
                "remote_num_tokens": len(ids)},
        })
