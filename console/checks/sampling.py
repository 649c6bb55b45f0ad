"""sampling.defaults: both sides apply the same generation defaults.

Otherwise a PD deployment answers differently from a single server with the same model, the
seeds' "results differ from single-process deployment".
"""

from __future__ import annotations

import json
from typing import Any

from console.checks.base import Verdict, check, error
from console.checks.plan import PlanView, describe

# vLLM's values when nothing sets a key (SamplingParams defaults).
NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def _show(frozen: tuple[tuple[str, Any], ...]) -> str:
    return json.dumps(dict(frozen), sort_keys=True) if frozen else "{} (vLLM's neutral defaults)"


@check("sampling.defaults", "generation config identical on both sides")
def sampling_defaults(plan: PlanView) -> Verdict:
    count, text = describe(plan, lambda w: tuple(sorted(plan.sampling(w).items())), _show)
    if count == 1:
        return Verdict(summary=text)
    effective = [plan.sampling(w) for w in plan.workers]
    keys = sorted({key for values in effective for key in values
                   if len({json.dumps(other.get(key)) for other in effective}) > 1})
    # Decode samples the answer, so its values are the ones to pin for everyone.
    decode = next((w for w in plan.workers if w.role == "decode"), plan.workers[-1])
    chosen = plan.sampling(decode)
    suggestion = {key: chosen.get(key, NEUTRAL.get(key)) for key in keys}
    suggestion = {key: value for key, value in suggestion.items() if value is not None}
    return Verdict([error(
        f"sampling defaults differ ({', '.join(keys)}): {text}",
        "set them in the plan's sampling defaults so every worker overrides its model's "
        f"generation_config.json the same way, e.g. {json.dumps(suggestion, sort_keys=True)}")],
        text)
