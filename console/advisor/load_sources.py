"""The load the advice is for: what the deployment's router recorded over a window, or a
synthetic profile typed in. Both become inference/advisor/load.py's LoadProfile."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from console.deployments.models import Deployment
from console.live.models import LogLine
from inference.advisor.errors import InputError
from inference.advisor.load import LoadProfile, profile_from_json
from inference.advisor.recorded import PREFIX, profile_from_timelines, timeline_records

WINDOWS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
# Enough requests for stable percentiles; a recorded window is replayed at its own rate.
SYNTHETIC_REQUESTS = 200
MAX_TIMELINES = 20_000


class LoadUnavailable(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Load:
    profile: LoadProfile
    description: str


def recorded(deployment: Deployment, window: str) -> Load:
    """The router's ``timeline {...}`` log lines of the last ``window`` (hour or day)."""
    if window not in WINDOWS:
        raise LoadUnavailable("window", f"one of {', '.join(WINDOWS)}, got {window!r}")
    since = timezone.now() - WINDOWS[window]
    texts = LogLine.objects.filter(
        process__deployment=deployment, process__role="router", created__gte=since,
        text__contains=PREFIX + "{").order_by("created", "seq").values_list("text", flat=True)
    try:
        found = profile_from_timelines(timeline_records(texts[:MAX_TIMELINES], "window"), "window")
    except InputError as exc:
        raise LoadUnavailable("window", f"the last {window}: {exc}") from exc
    stream = found.profile.streams[0]
    return Load(found.profile, f"recorded, last {window}: {found.used} requests "
                               f"({found.skipped} skipped), {stream.rate_per_s:.3g} req/s")


def synthetic(rate_per_s: float, prompt_tokens: list[int], output_tokens: list[int]) -> Load:
    """A Poisson stream at ``rate_per_s`` whose lengths are drawn from the samples given."""
    try:
        profile = profile_from_json({"streams": [{
            "name": "synthetic", "rate_per_s": rate_per_s, "requests": SYNTHETIC_REQUESTS,
            "prompt_tokens": prompt_tokens, "output_tokens": output_tokens}]})
    except InputError as exc:
        field = exc.where.rsplit(".", 1)[-1] if exc.where else "load"
        raise LoadUnavailable(field, str(exc)) from exc
    return Load(profile, f"synthetic: {rate_per_s:g} req/s, prompts {_spread(prompt_tokens)} "
                         f"tokens, answers {_spread(output_tokens)} tokens")


def _spread(values: list[int]) -> str:
    return str(values[0]) if len(set(values)) == 1 else f"{min(values)}-{max(values)}"
