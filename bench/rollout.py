"""TTFT during each phase of a rollout under a steady load, against steady state before it.

Starts a console of its own with the tiny random-weight model in a 1-prefill/1-decode plan
(tests/borrowed.py's facility: `manage.py up --no-start`, SQLite, ports from the kernel), sends
streamed completions from a few clients without pause, measures steady state, then rolls a
second revision (another random-weight model) out and back, and prints per phase: requests,
TTFT p50 and p99 (and their ratio to steady state), requests lost, and the phase's duration.

    .venv/bin/python bench/rollout.py --clients 2 --steady-s 30 --strategy canary
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.borrowed import SMOLLM2, BorrowedDeployment, Handle  # noqa: E402
from tests.tiny_llama import SHARED_TINY, build_tiny_llama  # noqa: E402

PROMPT = "Write one sentence about the sea and the"


@dataclass
class Sample:
    sent: float
    ttft: float | None
    ok: bool
    revision: str


@dataclass
class Load:
    router: str
    model: str
    samples: list[Sample] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def client(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                sent = time.monotonic()
                ttft, ok, revision = None, False, ""
                try:
                    with client.stream("POST", f"{self.router}/v1/completions", json={
                            "model": self.model, "prompt": PROMPT, "max_tokens": 8,
                            "temperature": 0, "stream": True}) as response:
                        revision = response.headers.get("X-Pdserve-Revision", "")
                        ok = response.status_code == 200
                        for line in response.iter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            event = json.loads(line.removeprefix("data: "))
                            if "error" in event:
                                ok = False
                                break
                            if ttft is None:
                                ttft = time.monotonic() - sent
                except httpx.HTTPError:
                    ok = False
                self.samples.append(Sample(sent, ttft, ok, revision))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = (len(ordered) - 1) * q
    low = int(index)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def rollout(handle: Handle, revision: int, strategy: str) -> tuple[dict[str, Any], float]:
    """Run a rollout to its end; returns it and the monotonic time it started."""
    started = time.monotonic()
    response = handle.call("POST", "/api/v1/rollouts/", json={
        "deployment": handle.deployment_id, "revision": revision, "strategy": strategy,
        "steps": [{"weight": 10, "hold_s": 15}, {"weight": 50, "hold_s": 15},
                  {"weight": 100, "hold_s": 0}],
        "analysis": {"interval_s": 5, "failure_limit": 2, "min_requests": 3,
                     "metrics": {"error_rate": {"max": 0.0}, "ttft_p95": {"max_ratio": 10}}},
        "scale_down_delay_s": 10, "drain_timeout_s": 60})
    response.raise_for_status()
    return finished(handle, response.json()["id"]), started


def finished(handle: Handle, rollout_id: int) -> dict[str, Any]:
    while True:
        body = handle.call("GET", f"/api/v1/rollouts/{rollout_id}/").json()
        if body["state"] in ("succeeded", "rolled_back"):
            return body
        time.sleep(1)


def phases(body: dict[str, Any], started: float, ended: float) -> list[tuple[str, float, float]]:
    """(name, start, end) in monotonic time, from the rollout's transitions (wall clock)."""
    from datetime import datetime

    rows = body["transitions"]
    wall0 = datetime.fromisoformat(rows[0]["at"]).timestamp()
    spans = []
    for row, after in zip(rows, [*rows[1:], None], strict=False):
        begin = started + datetime.fromisoformat(row["at"]).timestamp() - wall0
        end = ended if after is None else started + (
            datetime.fromisoformat(after["at"]).timestamp() - wall0)
        name = row["to_state"]
        if name == "stepping":
            name = f"stepping {row['weights']}"
        if end > begin:
            spans.append((name, begin, end))
    return spans


def table(title: str, load: Load, spans: list[tuple[str, float, float]],
          steady: tuple[float, float]) -> None:
    print(f"\n{title}\n")
    print("| phase | duration | requests | lost | TTFT p50 | TTFT p99 | p50 / steady | p99 / steady |")
    print("|---|---|---|---|---|---|---|---|")
    for name, begin, end in spans:
        inside = [s for s in load.samples if begin <= s.sent < end]
        ttfts = [s.ttft for s in inside if s.ttft is not None]
        lost = sum(not s.ok for s in inside)
        if ttfts:
            p50, p99 = percentile(ttfts, 0.5) * 1000, percentile(ttfts, 0.99) * 1000
            print(f"| {name} | {end - begin:.1f} s | {len(inside)} | {lost} | {p50:.0f} ms | "
                  f"{p99:.0f} ms | {p50 / 1000 / steady[0]:.2f} | {p99 / 1000 / steady[1]:.2f} |")
        else:
            print(f"| {name} | {end - begin:.1f} s | {len(inside)} | {lost} | - | - | - | - |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--steady-s", type=float, default=30.0)
    parser.add_argument("--strategy", choices=["canary", "blue_green"], default="canary")
    args = parser.parse_args()
    facility = BorrowedDeployment()
    root = Path(tempfile.mkdtemp(prefix="pdserve-bench-rollout-"))
    try:
        with facility.borrow(root) as handle:
            other = build_tiny_llama(SMOLLM2, SHARED_TINY.parent / "tiny-llama-2l-untied", seed=1,
                             tied=False)
            handle.call("POST", "/api/v1/variants/", json={
                "base_model": "tiny", "name": "f32-untied", "path": str(other)})
            draft = handle.call("POST", f"/api/v1/deployments/{handle.deployment_id}/revisions/",
                                json={"variants": {"prefill": "tiny/f32-untied",
                                                   "decode": "tiny/f32-untied"},
                                      "gate": {"mode": "off"}})
            draft.raise_for_status()
            load = Load(handle.router, handle.served_model_name)
            threads = [threading.Thread(target=load.client, daemon=True)
                       for _ in range(args.clients)]
            for thread in threads:
                thread.start()
            time.sleep(args.steady_s)
            steady_end = time.monotonic()
            steady = [s.ttft for s in load.samples if s.ttft is not None]
            reference = (percentile(steady, 0.5), percentile(steady, 0.99))
            body, started = rollout(handle, draft.json()["number"], args.strategy)
            out_end = time.monotonic()
            print(f"steady state ({args.clients} clients streaming without pause, "
                  f"{len(steady)} requests in {args.steady_s:.0f} s): TTFT p50 "
                  f"{reference[0] * 1000:.0f} ms, p99 {reference[1] * 1000:.0f} ms; "
                  f"lost {sum(not s.ok for s in load.samples if s.sent < steady_end)}")
            table(f"{args.strategy} r{body['from_revision']} -> r{body['to_revision']}: "
                  f"{body['state']}", load, phases(body, started, out_end), reference)
            back, back_started = rollout_back(handle)
            time.sleep(10)
            load.stop.set()
            for thread in threads:
                thread.join(timeout=130)
            table(f"rollback r{back['from_revision']} -> r{back['to_revision']} (blue-green): "
                  f"{back['state']}", load, phases(back, back_started, time.monotonic() - 10),
                  reference)
            lost = sum(not s.ok for s in load.samples)
            print(f"\nin all: {len(load.samples)} requests, {lost} lost")
    finally:
        facility.close()
    return 0


def rollout_back(handle: Handle) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    response = handle.call("POST", f"/api/v1/deployments/{handle.deployment_id}/rollback/")
    if response.status_code != 201:
        raise SystemExit(f"the rollback was refused: {response.status_code} {response.text}")
    return finished(handle, response.json()["id"]), started


if __name__ == "__main__":
    sys.exit(main())
