"""A compressed day of arrivals against the tiny model, autoscaled and statically provisioned.

Starts a console of its own with the tiny random-weight model in a 1-prefill/1-decode plan
(tests/borrowed.py's facility: `manage.py up --no-start`, SQLite, ports from the kernel) and
replays one day twice, compressed into ``--day-s`` seconds: Poisson arrivals whose rate follows
a daily curve with one peak (a low night, a peak in the afternoon). First with a decode policy
(1 to ``--peak-decode`` instances on the requests in flight per instance), then with the decode
pool fixed at ``--peak-decode`` instances all day, as static provisioning for the peak would be.

It prints, for both: requests, instance-seconds of prefill and decode workers (a worker counts
from its start to its stop, starting or ready), TTFT and TPOT SLO attainment (the share of
requests within both SLOs, and each alone), requests lost; and the autoscaler's decisions.

    .venv/bin/python bench/autoscale.py --day-s 720 --peak-rps 8 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.rollout import percentile  # noqa: E402
from tests.borrowed import ADMIN_PASSWORD, BorrowedDeployment, Handle, plan_body  # noqa: E402

PROMPT = "Write one sentence about the sea and the"


@dataclass
class Request:
    sent: float
    ttft: float | None = None
    tpot: float | None = None
    ok: bool = False


@dataclass
class Day:
    """One replay: the requests sent and the worker-seconds counted."""

    requests: list[Request] = field(default_factory=list)
    instance_s: dict[str, float] = field(default_factory=lambda: {"prefill": 0.0, "decode": 0.0})
    started: float = 0.0


def rate(hour: float, base: float, peak: float) -> float:
    """Requests per second at ``hour`` of the day: a night floor and one afternoon peak."""
    return base + (peak - base) * math.exp(-((hour - 14.0) / 2.5) ** 2)


def send(client: httpx.Client, router: str, model: str, request: Request,
         max_tokens: int) -> None:
    first = last = None
    chunks = 0
    try:
        with client.stream("POST", f"{router}/v1/completions", json={
                "model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}) as response:
            ok = response.status_code == 200
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line.removeprefix("data: "))
                if "error" in event:
                    ok = False
                    break
                now = time.monotonic()
                first = first or now
                last = now
                chunks += 1
    except httpx.HTTPError:
        ok = False
    request.ok = ok and first is not None
    if first is not None:
        request.ttft = first - request.sent
        if chunks > 1 and last is not None:
            request.tpot = (last - first) / (chunks - 1)


def replay(handle: Handle, day_s: float, base: float, peak: float, seed: int,
           max_tokens: int) -> Day:
    """Send the day's arrivals (open loop: nobody waits for an answer to send the next one) and
    count each second's prefill and decode workers."""
    day = Day(started=time.monotonic())
    done = threading.Event()
    counter = threading.Thread(target=count_workers, args=(handle, day, done), daemon=True)
    counter.start()
    generator = random.Random(seed)
    threads: list[threading.Thread] = []
    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=256)) as client:
        at = 0.0
        while at < day_s:
            hour = 24.0 * at / day_s
            # Rates are per compressed second: the day's curve, unchanged in shape.
            at += generator.expovariate(max(rate(hour, base, peak), 1e-6))
            delay = day.started + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            request = Request(sent=time.monotonic())
            day.requests.append(request)
            thread = threading.Thread(target=send, args=(client, handle.router,
                                                         handle.served_model_name, request,
                                                         max_tokens), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(timeout=300)
    done.set()
    counter.join(timeout=10)
    return day


def count_workers(handle: Handle, day: Day, done: threading.Event) -> None:
    last = time.monotonic()
    while not done.is_set():
        time.sleep(1.0)
        processes = handle.processes()
        now = time.monotonic()
        for process in processes.values():
            role = process["role"]
            if role in day.instance_s and process["state"] in ("starting", "ready"):
                day.instance_s[role] += now - last
        last = now


def share_devices(handle: Handle) -> None:
    """The borrowed plan pins prefill and decode to the two cores of a 2-core machine: a third
    worker shares one, which the plan declares (a live edit: nothing restarts)."""
    body = plan_body(handle.deployment())
    for role in ("prefill", "decode"):
        for instance in body[role]["instances"]:
            instance["share_devices"] = True
    response = handle.call("PUT", f"/api/v1/deployments/{handle.deployment_id}/", json=body)
    if response.status_code != 200:
        raise SystemExit(f"the plan edit was refused: {response.status_code} {response.text}")


def set_decode(handle: Handle, count: int, timeout_s: float = 900.0) -> None:
    """Plan ``count`` decode instances and wait until each is ready."""
    deployment = handle.deployment()
    body = plan_body(deployment)
    instances = body["decode"]["instances"]
    body["decode"]["instances"] = (instances + [{"share_devices": True}
                                                for _ in range(count - len(instances))])[:count]
    response = handle.call("PUT", f"/api/v1/deployments/{handle.deployment_id}/", json=body)
    if response.status_code not in (200, 202):
        raise SystemExit(f"the plan edit was refused: {response.status_code} {response.text}")
    deadline = time.monotonic() + timeout_s
    while True:
        processes = handle.processes()
        ready = [s for s, p in processes.items()
                 if s.startswith("decode-") and p["state"] == "ready"]
        if len(ready) >= count and len([s for s in processes if s.startswith("decode-")
                                        and processes[s]["state"] != "stopped"]) == count:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"decode did not reach {count} ready instances: {processes}")
        time.sleep(2)


def idle_cost(handle: Handle, seconds: float = 15.0) -> tuple[float, float]:
    """What one idle decode worker costs: resident memory of its process tree (GiB) and CPU
    (% of one core) over ``seconds`` without requests."""
    pid = handle.processes()["decode-0"]["pid"]
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    times = sum(p.cpu_times().user + p.cpu_times().system for p in tree)
    time.sleep(seconds)
    used = sum(p.cpu_times().user + p.cpu_times().system for p in tree) - times
    rss = sum(p.memory_info().rss for p in tree)
    return rss / 2**30, 100 * used / seconds


def row(name: str, day: Day, ttft_slo: float, tpot_slo: float) -> str:
    done = [r for r in day.requests if r.ok]
    lost = len(day.requests) - len(done)
    within_ttft = sum(1 for r in done if r.ttft is not None and r.ttft <= ttft_slo)
    within_tpot = sum(1 for r in done if r.tpot is None or r.tpot <= tpot_slo)
    within_both = sum(1 for r in done if r.ttft is not None and r.ttft <= ttft_slo
                      and (r.tpot is None or r.tpot <= tpot_slo))
    total = max(1, len(day.requests))  # a lost request missed both SLOs
    ttfts = [r.ttft for r in done if r.ttft is not None]
    tpots = [r.tpot for r in done if r.tpot is not None]
    return (f"| {name} | {len(day.requests)} | {day.instance_s['prefill']:.0f} | "
            f"{day.instance_s['decode']:.0f} | {within_both / total:.1%} | "
            f"{within_ttft / total:.1%} | {within_tpot / total:.1%} | "
            f"{percentile(ttfts, 0.9) * 1000:.0f} ms | {percentile(tpots, 0.9) * 1000:.1f} ms | "
            f"{lost} |")


def decisions(handle: Handle, since: datetime, day_s: float) -> list[str]:
    rows = handle.call("GET", f"/api/v1/deployments/{handle.deployment_id}/scaling-decisions/",
                       params={"role": "decode", "limit": 500}).json()["results"]
    lines = []
    for decision in reversed(rows):
        at = datetime.fromisoformat(decision["at"])
        if at < since:
            continue
        hour = 24.0 * (at - since).total_seconds() / day_s
        lines.append(f"| {hour:05.2f} h | {decision['action']} | {decision['current']} -> "
                     f"{decision['target']} | {decision['desired']} | {decision['reason']} | "
                     f"{decision['value']} | {decision['evaluations']} | "
                     f"{decision['detail'][:80]} |")
    return lines


def screenshot(handle: Handle, out: Path) -> None:
    """The autoscaling page after the autoscaled day, as the README shows it."""
    from tests.chromium import launched, signed_in

    name = handle.deployment()["name"]
    with launched() as browser, signed_in(browser, handle.console, "admin",
                                          ADMIN_PASSWORD) as page:
        page.set_viewport_size({"width": 1280, "height": 1400})
        page.goto(f"/deployments/{name}/autoscaling/")
        page.wait_for_timeout(3000)
        page.screenshot(path=str(out), full_page=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--day-s", type=float, default=720.0, help="seconds one day takes")
    parser.add_argument("--base-rps", type=float, default=0.3, help="the night's arrival rate")
    parser.add_argument("--peak-rps", type=float, default=8.0, help="the peak's arrival rate")
    parser.add_argument("--peak-decode", type=int, default=2,
                        help="decode instances at the peak (and all day, statically)")
    parser.add_argument("--ttft-slo-ms", type=float, default=500.0)
    parser.add_argument("--tpot-slo-ms", type=float, default=50.0)
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="tokens each answer generates (decode's share of a request)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--screenshot", type=Path,
                        help="write the autoscaling page after the autoscaled day to this PNG")
    args = parser.parse_args()
    facility = BorrowedDeployment()
    root = Path(tempfile.mkdtemp(prefix="pdserve-bench-autoscale-"))
    ttft_slo, tpot_slo = args.ttft_slo_ms / 1000, args.tpot_slo_ms / 1000
    # Windows in compressed time: a day's hour is day_s / 24 seconds.
    hour_s = args.day_s / 24
    policy = {"mode": "active", "signal": "concurrency", "min_instances": 1,
              "max_instances": args.peak_decode, "scale_up_at": 1.0, "scale_down_at": 0.3,
              "up_window_s": 10, "down_window_s": max(20, round(hour_s)),
              "max_step": 1, "cooldown_s": max(30, round(1.5 * hour_s))}
    try:
        with facility.borrow(root) as handle:
            idle_gib, idle_cpu = idle_cost(handle)
            share_devices(handle)
            path = f"/api/v1/deployments/{handle.deployment_id}/autoscaling/decode/"
            handle.call("PUT", path, json=policy).raise_for_status()
            since = datetime.now().astimezone()
            scaled = replay(handle, args.day_s, args.base_rps, args.peak_rps, args.seed,
                            args.max_tokens)
            scaled_decisions = decisions(handle, since, args.day_s)
            if args.screenshot:
                screenshot(handle, args.screenshot)
            handle.call("DELETE", path).raise_for_status()
            set_decode(handle, args.peak_decode)
            static = replay(handle, args.day_s, args.base_rps, args.peak_rps, args.seed,
                            args.max_tokens)
            set_decode(handle, 1)
    finally:
        facility.close()
    print(f"one day in {args.day_s:.0f} s ({hour_s:.0f} s an hour), arrivals "
          f"{args.base_rps:g}-{args.peak_rps:g} req/s (peak at 14 h), {args.max_tokens} tokens "
          f"each, streamed; SLOs: TTFT {args.ttft_slo_ms:.0f} ms, TPOT {args.tpot_slo_ms:.0f} ms; "
          f"policy {policy}\n")
    print("| provisioning | requests | prefill instance-s | decode instance-s | both SLOs | "
          "TTFT SLO | TPOT SLO | TTFT p90 | TPOT p90 | lost |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(row(f"autoscaled decode 1-{args.peak_decode}", scaled, ttft_slo, tpot_slo))
    print(row(f"static decode {args.peak_decode}", static, ttft_slo, tpot_slo))
    saved = 1 - (sum(scaled.instance_s.values()) / max(1.0, sum(static.instance_s.values())))
    print(f"\ninstance-seconds saved by autoscaling: {saved:.1%}\n")
    print(f"one idle decode worker (a pool at its minimum keeps one): {idle_gib:.2f} GiB "
          f"resident, {idle_cpu:.1f} % of one core\n")
    print("| time of day | action | count | desired | reason | signal | evaluations | detail |")
    print("|---|---|---|---|---|---|---|---|")
    for line in scaled_decisions:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
