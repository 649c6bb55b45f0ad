"""The advice in a few printed lines, for ``manage.py up`` and ``manage.py advise``: the
recommendation for a default load profile (or the one given), the current plan's place among
the candidates, and the one command that switches (or measures, before any speeds exist)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import reverse

from console.advisor.load_sources import Load, synthetic
from console.advisor.predictions import advise
from console.deployments.models import Deployment

# What the default deployment is expected to serve before it has recorded anything: a chat
# stream of mostly short prompts with some long documents, answers of a paragraph or so, one
# request a second (what one small model on a few cores serves).
DEFAULT_RATE_PER_S = 1.0
DEFAULT_PROMPT_TOKENS = [64, 128, 128, 256, 256, 512, 1024]
DEFAULT_OUTPUT_TOKENS = [32, 64, 128, 128, 256]
SHOWN = 4  # candidates printed; the page lists them all


def default_load() -> Load:
    return synthetic(DEFAULT_RATE_PER_S, DEFAULT_PROMPT_TOKENS, DEFAULT_OUTPUT_TOKENS)


def advice_lines(deployment: Deployment, advice: dict[str, Any], page_url: str) -> list[str]:
    """``advice`` (predictions.advise) as printed lines; ``page_url`` is the topology page."""
    name = deployment.name
    if advice["status"] == "not_measured":
        return [f"topology advice for {name}: {advice['detail']}.",
                f"  measure them (a few minutes of this machine): manage.py advise {name} "
                f"--measure, or the button on {page_url}"]
    if advice["status"] != "advised":
        return [f"topology advice for {name}: {advice.get('detail', advice['status'])}."]
    slo = advice["slo"]
    lines = [f"topology advice for {name} ({advice['load']}; SLOs TTFT {slo['ttft_ms']} ms, "
             f"TPOT {slo['tpot_ms']} ms; speeds #{advice['measured']} of {advice['variant']} "
             f"on {advice['node']}):"]
    rows = advice["candidates"]
    shown = rows[:SHOWN] + [r for r in rows[SHOWN:] if r["current"]]
    for rank, row in enumerate(rows, start=1):
        if row not in shown:
            continue
        marks = [m for m, on in (("current", row["current"]), ("recommended", rank == 1)) if on]
        confidence = row["confidence"]
        lines.append(
            f"  {rank}. {row['topology']:<14} {row['goodput_rps']:.2f} req/s within the SLOs "
            f"({row['slo_attained']:.0%} of requests; tied best in {confidence['best_in']} of "
            f"{confidence['seeds']} draws)" + (f"  <- {', '.join(marks)}" if marks else ""))
    best = rows[0]
    if not advice["switch"]:
        lines.append(f"  the current plan ({advice['current']}) is the best for this load.")
    elif best["mode"] == deployment.mode:
        lines.append(f"  switch: set the instances to {best['topology']} (a live edit of the "
                     f"plan, or a pool policy's band) on {page_url}")
    else:
        lines.append(f"  switch: manage.py advise {name} --apply (a draft revision rolled out "
                     f"blue-green), or the button on {page_url}")
    return lines


def default_advice(deployment: Deployment) -> dict[str, Any]:
    return advise(deployment, default_load)


def topology_page(deployment: Deployment) -> str:
    """The deployment's topology page on this console, as the printed advice links it."""
    host, port = settings.PDSERVE_CONSOLE_HOST, settings.PDSERVE_CONSOLE_PORT
    return f"http://{host}:{port}{reverse('topology-advice', args=[deployment.name])}"
