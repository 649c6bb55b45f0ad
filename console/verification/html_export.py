"""The report as one self-contained HTML file: inline CSS, an inline SVG chart, nothing
fetched from anywhere, so it opens from a mail attachment or a ticket as it is."""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from console.verification.models import VerificationReport

WIDTH, HEIGHT, PAD = 560, 260, 44
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def _points(report: VerificationReport) -> list[dict[str, Any]]:
    performance = report.section("performance") or {}
    return [p for p in performance.get("numbers", {}).get("points", []) if "skipped" not in p]


def chart(report: VerificationReport, metric: str = "ttft_ms_p50") -> SafeString:
    """An SVG line chart of ``metric`` against mean prompt tokens, one line per concurrency."""
    lines: dict[int, list[tuple[float, float]]] = {}
    for point in _points(report):
        x, y = point.get("mean_prompt_tokens"), point.get(metric)
        if x is not None and y is not None:
            lines.setdefault(point["concurrency"], []).append((float(x), float(y)))
    if not lines:
        return mark_safe("")
    xs = [x for line in lines.values() for x, _ in line]
    ys = [y for line in lines.values() for _, y in line]
    x_max, y_max = max(xs) or 1.0, max(ys) or 1.0

    def at(x: float, y: float) -> tuple[str, str]:
        return (f"{PAD + x / x_max * (WIDTH - 2 * PAD):.1f}",
                f"{HEIGHT - PAD - y / y_max * (HEIGHT - 2 * PAD):.1f}")

    # Inline in HTML, an <svg> needs no namespace attribute (and the file names no URL).
    parts = [f'<svg width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(metric)}">',
             f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
             'stroke="#555"/>',
             f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#555"/>',
             f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle">prompt tokens '
             f'(max {x_max:.0f})</text>',
             f'<text x="8" y="{PAD - 12}">{escape(metric)} (max {y_max:.0f} ms)</text>']
    for n, (concurrency, line) in enumerate(sorted(lines.items())):
        colour = COLOURS[n % len(COLOURS)]
        path = " ".join(",".join(at(x, y)) for x, y in sorted(line))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        parts += [f'<circle cx="{cx}" cy="{cy}" r="3" fill="{colour}"/>'
                  for cx, cy in (at(x, y) for x, y in line)]
        parts.append(f'<text x="{WIDTH - PAD + 4}" y="{PAD + 14 * n}" fill="{colour}">'
                     f'c={concurrency}</text>')
    parts.append("</svg>")
    # Every value above is a number or escaped.
    return mark_safe("".join(parts))


def render_report(report: VerificationReport) -> str:
    return render_to_string("verification/export.html", {
        "report": report, "deployment": report.deployment, "points": _points(report),
        "ttft_chart": chart(report, "ttft_ms_p50"), "tpot_chart": chart(report, "tpot_ms_p50")})
