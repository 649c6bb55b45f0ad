"""``python -m inference.advisor measure`` against a stub vLLM server: a fixed cost per prompt
token and per output token, so the measured curves have known shapes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inference.advisor import cli
from inference.advisor.speeds import speeds_from_json

PREFILL_S_PER_TOKEN = 0.00002
DECODE_S_PER_TOKEN = 0.002
KEY = "measure-key-5e1"


class StubVllm(BaseHTTPRequestHandler):
    seen_auth: list[str] = []

    def log_message(self, *args: Any) -> None:  # keep the test output quiet
        pass

    def _json(self, body: dict[str, Any], status: int = 200) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        StubVllm.seen_auth.append(self.headers.get("Authorization", ""))
        self._json({"data": [{"id": "tiny"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self._json({"tokens": list(range(1, 300))})
            return
        prompt, tokens = len(body["prompt"]), body["max_tokens"]
        time.sleep(prompt * PREFILL_S_PER_TOKEN)
        if not body.get("stream"):
            time.sleep(tokens * DECODE_S_PER_TOKEN)
            self._json({"usage": {"completion_tokens": tokens}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(tokens):
            time.sleep(DECODE_S_PER_TOKEN)
            self.wfile.write(b'data: {"choices": [{"text": "a"}]}\n\n')
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


@pytest.fixture
def stub_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_measure_prints_speeds_the_simulator_reads(stub_url: str, capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_MEASURE_KEY", KEY)
    code = cli.main(["measure", "--url", stub_url, "--prompt-tokens", "100,2000",
                     "--batches", "1,2", "--contexts", "64", "--repeats", "1",
                     "--kv-dir", str(tmp_path), "--kv-bytes-per-token", "64"])
    found = events(capsys.readouterr().out)
    assert code == 0
    stages = {e["stage"] for e in found if e["event"] == "progress"}
    assert stages == {"prefill", "decode", "interference", "handoff"}
    result = found[-1]
    assert result["event"] == "result"
    speeds = speeds_from_json(result["speeds"])
    # Longer prompts cost more; a decode step costs about the stub's per-token sleep.
    assert speeds.prefill_ms(1, 2000) > speeds.prefill_ms(1, 100)
    assert 1.5 <= speeds.decode_step_ms(1, 64) <= 10
    # The hand-off was timed at each prompt length (writing and reading its KV bytes takes
    # time), and the simulator reads those very points back.
    table = result["speeds"]["handoff_ms"]
    assert table["tokens"] == [100, 2000] and all(ms > 0 for ms in table["ms"]), table
    assert speeds.handoff_ms(2000) == pytest.approx(table["ms"][1])
    assert f"Bearer {KEY}" in StubVllm.seen_auth
    assert list(tmp_path.iterdir()) == []  # the hand-off's file is removed


def test_measure_without_kv_dir_reports_no_handoff(stub_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["measure", "--url", stub_url, "--prompt-tokens", "50,100", "--batches", "1",
                     "--contexts", "32", "--repeats", "1"]) == 0
    assert "handoff_ms" not in events(capsys.readouterr().out)[-1]["speeds"]


def test_unreachable_server_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["measure", "--url", "http://127.0.0.1:9", "--prompt-tokens", "50,100"]) == 2
    found = events(capsys.readouterr().out)
    assert [e["event"] for e in found] == ["error"]


def test_one_prompt_length_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["measure", "--url", "http://127.0.0.1:9", "--prompt-tokens", "100"]) == 2
    assert events(capsys.readouterr().out)[-1]["field"] == "--prompt-tokens"


class ContendedStub(StubVllm):
    """Two of these share the machine: a token costs ``SLOWER`` times more while the other
    server is busy with a request."""

    SLOWER = 2.0
    active: dict[int, int] = {}  # port -> requests being answered

    def do_POST(self) -> None:
        if self.path == "/tokenize":
            super().do_POST()
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        port = self.server.server_address[1]
        ContendedStub.active[port] = ContendedStub.active.get(port, 0) + 1
        streamed = bool(body.get("stream"))
        try:
            time.sleep(len(body["prompt"]) * PREFILL_S_PER_TOKEN)
            if streamed:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
            for _ in range(body["max_tokens"]):
                others = sum(n for p, n in ContendedStub.active.items() if p != port)
                time.sleep(DECODE_S_PER_TOKEN * (self.SLOWER if others else 1.0))
                if streamed:
                    self.wfile.write(b'data: {"choices": [{"text": "a"}]}\n\n')
                    self.wfile.flush()
        finally:
            ContendedStub.active[port] -= 1
        if streamed:
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
        else:
            self._json({"usage": {"completion_tokens": body["max_tokens"]}})


def test_a_neighbour_busy_on_the_machine_is_measured_as_its_factor(
        capsys: pytest.CaptureFixture[str]) -> None:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), ContendedStub) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    url, neighbour = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
    try:
        assert cli.main(["measure", "--url", url, "--neighbour-url", neighbour,
                         "--prompt-tokens", "50,100", "--batches", "1,2", "--contexts", "32",
                         "--repeats", "1"]) == 0
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    found = events(capsys.readouterr().out)
    assert any(e.get("stage") == "neighbour" for e in found)
    speeds = found[-1]["speeds"]
    # Alone a token costs the stub's sleep; beside the busy neighbour twice that.
    assert 1.6 <= speeds["neighbour"]["factor"] <= 2.4, speeds
    with_handoff = {**speeds, "handoff_ms": {"tokens": [0], "ms": [1]}}  # none measured here
    assert speeds_from_json(with_handoff).neighbour_factor == speeds["neighbour"]["factor"]
