"""``python -m inference.advisor``: rank topologies for a load under TTFT and TPOT SLOs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from inference.advisor.candidates import Ranked, rank
from inference.advisor.errors import InputError
from inference.advisor.goodput import PERCENTILES, Slo
from inference.advisor.load import LoadProfile, load_profile
from inference.advisor.recorded import profile_from_timelines, timeline_records
from inference.advisor.speeds import load_speeds

T = TypeVar("T")
ATTAINMENT = 0.9


def positive(kind: type[float] | type[int]) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            expected = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not value > 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference.advisor",
        description="Simulate a load against measured server speeds for every colocated and "
                    "prefill/decode topology the devices allow; rank them by goodput under the "
                    "TTFT and TPOT SLOs.")
    parser.add_argument("--speeds", type=Path, required=True,
                        help="measured speeds (JSON; see inference/advisor/speeds.py)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--load", type=Path, help="a load profile (JSON; see inference/advisor/load.py)")
    source.add_argument("--timelines", type=Path,
                        help="router log lines holding 'timeline {...}' records: the recorded load")
    parser.add_argument("--ttft-slo-ms", type=positive(float), required=True)
    parser.add_argument("--tpot-slo-ms", type=positive(float), required=True)
    parser.add_argument("--devices", type=positive(int), required=True,
                        help="devices (CPU cores or GPUs) to place servers on")
    parser.add_argument("--seeds", type=positive(int), default=5,
                        help="workloads drawn per candidate, for the confidence (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    return parser


def read(flag: str, path: Path, reader: Callable[[Path], T]) -> T:
    """Reads one input file; a fault inside it is reported under the flag and the file's name."""
    try:
        return reader(path)
    except InputError as exc:
        if exc.where == flag:
            raise
        raise InputError(flag, f"{path}: {exc}") from exc


def recorded_profile(path: Path) -> tuple[LoadProfile, str]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError("--timelines", f"cannot read {path}: {exc.strerror or exc}") from exc
    recorded = profile_from_timelines(timeline_records(lines, "--timelines"), "--timelines")
    stream = recorded.profile.streams[0]
    return recorded.profile, (f"load: {recorded.used} recorded requests ({recorded.skipped} "
                              f"skipped: failed or without token counts), {stream.rate_per_s:.3g} req/s")


def triple(values: tuple[float, ...]) -> str:
    return "/".join(f"{v:.0f}" for v in values)


def table(ranked: list[Ranked], seeds: int) -> str:
    names = "/".join(f"p{p}" for p in PERCENTILES)
    rows = [("rank", "topology", "goodput req/s", "min-max", "SLO met", "best in",
             f"TTFT {names} ms", f"TPOT {names} ms", "ITL p99 ms", "E2E p99 ms")]
    for place, r in enumerate(ranked, 1):
        s = r.summary
        rows.append((str(place), r.topology.label, f"{s.goodput_rps:.3f}",
                     f"{min(r.goodput_by_seed):.3f}-{max(r.goodput_by_seed):.3f}",
                     f"{s.attained:.0%}", f"{r.best_in}/{seeds}", triple(s.ttft_ms),
                     triple(s.tpot_ms), f"{s.itl_ms[-1]:.0f}", f"{s.e2e_ms[-1]:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["measure"]:
        # Imported here: ranking needs no HTTP client.
        from inference.advisor.measure import main as measure_main
        return measure_main(argv[1:])
    args = build_parser().parse_args(argv)
    slo = Slo(args.ttft_slo_ms, args.tpot_slo_ms)
    seeds = list(range(args.seed, args.seed + args.seeds))
    try:
        speeds = read("--speeds", args.speeds, load_speeds)
        if args.load is not None:
            profile, source = read("--load", args.load, load_profile), f"load: {args.load}"
        else:
            profile, source = recorded_profile(args.timelines)
        ranked = rank(profile, speeds, slo, args.devices, seeds)
    except InputError as exc:
        print(f"advisor: {exc}", file=sys.stderr)
        return 2
    print(f"{source}; {len(seeds)} seeds, {ranked[0].summary.requests // len(seeds)} requests each")
    print(f"goodput: requests/s meeting TTFT <= {slo.ttft_ms:g} ms and TPOT <= {slo.tpot_ms:g} ms "
          "(vLLM's definition, at the load's offered rate)")
    print(table(ranked, len(seeds)))
    best = ranked[0]
    print(f"recommended: {best.topology.label} (tied for the highest goodput in {best.best_in} of "
          f"{len(seeds)} seeds)")
    if best.summary.attained < ATTAINMENT:
        # DistServe's goodput is the highest rate at which 90% meet the SLOs: then it is below
        # this load's rate on every candidate, and the table ranks overloaded topologies.
        print(f"note: no candidate meets both SLOs for {ATTAINMENT:.0%} of requests; this load "
              "is more than these devices can serve within them")
    return 0
