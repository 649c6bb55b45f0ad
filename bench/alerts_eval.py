"""What alert evaluation costs per tick, and how soon an outage fires.

Builds a throwaway SQLite console (migrated) with N PD deployments (1 prefill, 1 decode, a
router; their processes ready), each with the ready-made rules (R of them enabled), and stores
the collector's 1 s snapshots for them in simulated time. Then it runs the real evaluator
(console/alerts/evaluation.py) tick after tick, 5 simulated seconds apart, storing 5 more
snapshots per deployment before each, and prints per tick: wall time, the process's CPU time,
CPU per rule, and the share of the 5 s interval that a tick takes.

Detection latency: at a random instant within a tick interval one decode worker stops answering
(its snapshots say ``up`` 0, as the collector writes them); the latency is from that instant to
the tick that stores the worker-down alert as firing. It is the tick phase plus the tick's own
time; the collector's second adds at most 1 s more (the end-to-end test measures it live).

    .venv/bin/python bench/alerts_eval.py                      # 100 deployments x 15 rules
    .venv/bin/python bench/alerts_eval.py --deployments 20 --ticks 5
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TICK_S = 5.0


def _entries(second: int, decode_up: int = 1) -> dict[str, dict[str, Any]]:
    busy = 2 + second % 3
    worker = {"cpu": 35.0, "rss": 900 << 20, "running": busy, "waiting": 0, "kv_usage": 0.2,
              "prompt_tps": 400.0, "gen_tps": 30.0, "rps": 1.5, "ttft_p50": 0.08,
              "ttft_p95": 0.2, "tpot_p50": 0.03, "tpot_p95": 0.05}
    return {
        "prefill-0": {"role": "prefill", "up": 1, **worker},
        "decode-0": {"role": "decode", "up": decode_up, **worker},
        "router": {"role": "router", "up": 1, "cpu": 5.0, "rss": 80 << 20, "rps": 1.5,
                   "rps_by_status": {"200": 1.5}, "ttft_p50": 0.1, "ttft_p95": 0.25,
                   "handoff_p50": 0.05, "handoff_p95": 0.09, "fallback_ps": 0.0,
                   "in_flight": {"prefill": {"a": 1}, "decode": {"b": busy}},
                   "backend_errors_ps": {},
                   "handoffs": [{"prefill": "p", "decode": "d", "ok": 10 * second, "failed": 0,
                                 "failed_now": 0}]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--rules", type=int, default=15, help="enabled rules per deployment")
    parser.add_argument("--ticks", type=int, default=12, help="timed ticks")
    parser.add_argument("--detections", type=int, default=8, help="outages to time")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="pdserve-alerts-"))
    os.environ.update(PDSERVE_DATA_DIR=str(data), DJANGO_SETTINGS_MODULE="console.settings")
    os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from console.alerts.evaluation import Evaluator
    from console.alerts.models import Alert, AlertRule
    from console.deployments.defaults import ensure_default_deployment
    from console.deployments.models import Deployment, WorkerPlan
    from console.live.models import MetricSample
    from console.supervisor.models import ManagedProcess

    call_command("migrate", verbosity=0)
    model_dir = data / "model"
    model_dir.mkdir()
    template, _ = ensure_default_deployment(model_dir=model_dir)
    variant = template.workers.first().variant
    deployments = []
    start = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    for index in range(args.deployments):
        deployment = Deployment.objects.create(
            name=f"bench-{index}", base_model=template.base_model, served_model_name="m",
            router_port=20000 + index * 3, desired_state=Deployment.DesiredState.RUNNING)
        for offset, role in ((1, "prefill"), (2, "decode")):
            WorkerPlan.objects.create(deployment=deployment, role=role, variant=variant,
                                      port=20000 + index * 3 + offset)
        for slot, role in (("prefill-0", "prefill"), ("decode-0", "decode"), ("router", "router")):
            ManagedProcess.objects.create(deployment=deployment, slot=slot, role=role, port=1,
                                          state=ManagedProcess.State.READY, ready_at=start,
                                          log_path="/dev/null")
        keep = list(AlertRule.objects.filter(deployment=deployment).order_by("pk")
                    .values_list("pk", flat=True)[:args.rules])
        AlertRule.objects.filter(deployment=deployment).exclude(pk__in=keep).update(enabled=False)
        deployments.append(deployment)
    rules = AlertRule.objects.filter(enabled=True, deployment__in=deployments).count()

    def store(first: int, last: int) -> None:
        MetricSample.objects.bulk_create([
            MetricSample(deployment=d, resolution=MetricSample.Resolution.SECOND,
                         created=start + timedelta(seconds=s), data={"processes": _entries(s)})
            for s in range(first, last) for d in deployments])

    # The longest ready-made window is 5 minutes: fill it before the first tick.
    history = 300
    store(0, history)
    evaluator = Evaluator(holder="bench", lease_s=3600)
    now_s = history
    cold = _timed(evaluator, start + timedelta(seconds=now_s))
    walls, cpus = [], []
    for _ in range(args.ticks):
        store(now_s, now_s + int(TICK_S))
        now_s += int(TICK_S)
        wall, cpu, report = _timed(evaluator, start + timedelta(seconds=now_s))
        walls.append(wall)
        cpus.append(cpu)
        assert report.evaluated and report.rules == rules
    print(f"pdserve alert evaluation: {args.deployments} deployments x {rules // args.deployments}"
          f" rules = {rules} rules, {report.instances} instances, SQLite")
    print(f"\n{'':28} {'median':>9} {'max':>9}")
    print(f"{'tick wall (ms)':28} {statistics.median(walls) * 1000:9.1f} {max(walls) * 1000:9.1f}")
    print(f"{'tick CPU (ms)':28} {statistics.median(cpus) * 1000:9.1f} {max(cpus) * 1000:9.1f}")
    print(f"{'CPU per rule (us)':28} {statistics.median(cpus) / rules * 1e6:9.1f} "
          f"{max(cpus) / rules * 1e6:9.1f}")
    print(f"{'share of the 5 s interval':28} {statistics.median(walls) / TICK_S:9.1%} "
          f"{max(walls) / TICK_S:9.1%}")
    print(f"{'first tick (cold), wall ms':28} {cold[0] * 1000:9.1f}")

    rng = random.Random(7)
    latencies = []
    for attempt in range(args.detections):
        victim = deployments[attempt % len(deployments)]
        event = now_s + rng.uniform(0, TICK_S)
        fired_at = None
        for _ in range(3):
            # Snapshots after the event say "up": 0, as the collector writes them.
            MetricSample.objects.bulk_create([
                MetricSample(deployment=d, resolution=MetricSample.Resolution.SECOND,
                             created=start + timedelta(seconds=second),
                             data={"processes": _entries(second, 0 if d.pk == victim.pk
                                                         and second >= event else 1)})
                for second in range(now_s, now_s + int(TICK_S)) for d in deployments])
            now_s += int(TICK_S)
            wall, _cpu, _report = _timed(evaluator, start + timedelta(seconds=now_s))
            if Alert.objects.filter(deployment=victim, rule__key="worker_down",
                                    state="firing").exists():
                fired_at = now_s + wall
                break
        assert fired_at is not None, "worker down did not fire"
        latencies.append(fired_at - event)
        for _ in range(2):  # back up and resolved before the next outage
            store(now_s, now_s + int(TICK_S))
            now_s += int(TICK_S)
            _timed(evaluator, start + timedelta(seconds=now_s))
    print(f"\ndetection latency, event to firing ({args.detections} outages at random phases): "
          f"median {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s "
          "(+ up to 1 s of the collector's interval)")


def _timed(evaluator: Any, now: datetime) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    report = evaluator.tick(now)
    return time.perf_counter() - wall, time.process_time() - cpu, report


if __name__ == "__main__":
    main()
