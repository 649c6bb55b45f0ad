"""A report against the deployment's previous finished one: TTFT p50 or TPOT p50 worse by
more than a fifth and by more than a few milliseconds at the same sweep point, or a section
whose verdict got worse, is a regression."""

from __future__ import annotations

from typing import Any

from console.verification.verdicts import RANK

RELATIVE = 0.2
ABSOLUTE_MS = 5.0
COMPARED = ("ttft_ms_p50", "tpot_ms_p50", "itl_ms_p50", "e2el_ms_p50")


def _points(sections: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    performance = next((s for s in sections if s.get("name") == "performance"), None)
    points = (performance or {}).get("numbers", {}).get("points", [])
    return {(p["input_words"], p["concurrency"]): p for p in points if "skipped" not in p}


def compare(sections: list[dict[str, Any]], previous: list[dict[str, Any]]) -> list[dict[str, Any]]:
    regressions: list[dict[str, Any]] = []
    before = _points(previous)
    for key, point in sorted(_points(sections).items()):
        old = before.get(key)
        if old is None:
            continue
        for metric in COMPARED:
            new_v, old_v = point.get(metric), old.get(metric)
            if new_v is None or old_v is None:
                continue
            if new_v > old_v * (1 + RELATIVE) and new_v - old_v > ABSOLUTE_MS:
                regressions.append({
                    "metric": metric, "input_words": key[0], "concurrency": key[1],
                    "before": old_v, "after": new_v,
                    "change": round(new_v / old_v - 1, 3) if old_v else None})
    old_verdicts = {s["name"]: s["verdict"] for s in previous}
    for section in sections:
        was = old_verdicts.get(section["name"])
        if was is not None and RANK[section["verdict"]] > RANK[was]:
            regressions.append({"section": section["name"], "before": was,
                                "after": section["verdict"]})
    return regressions
