"""Writing pool policies and the ratio band: validated whole, audited, or not saved at all.

The API and the page both come here. A policy belongs to a pool the plan has (prefill and
decode in a PD plan, colocated otherwise); the prompt backlog is a prefill signal.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from console.audit.entries import delete_recorded, record, snapshot
from console.autoscaling.models import SIGNAL_DEFAULTS, PoolPolicy, RatioBand, Signal
from console.deployments.models import Deployment
from console.deployments.plans import POOL_ROLES

EDITABLE = ("mode", "signal", "min_instances", "max_instances", "scale_up_at", "scale_down_at",
            "up_window_s", "down_window_s", "max_step", "cooldown_s", "schedules")


def pool_roles(deployment: Deployment) -> tuple[str, ...]:
    return POOL_ROLES[Deployment.Mode(deployment.mode)]


def check_role(deployment: Deployment, role: str) -> None:
    roles = pool_roles(deployment)
    if role not in roles:
        raise ValidationError({"role": f"a {deployment.mode} plan has the pools "
                                       f"{', '.join(roles)}, not {role!r}"})


@transaction.atomic
def save_policy(deployment: Deployment, role: str, values: dict[str, Any],
                partial: bool = False) -> tuple[PoolPolicy, bool]:
    """Create or change ``role``'s policy; returns it and whether it was created. Thresholds
    left out take the signal's defaults when the policy is new or its signal changes."""
    check_role(deployment, role)
    policy = PoolPolicy.objects.select_for_update().filter(deployment=deployment,
                                                           role=role).first()
    created = policy is None
    if created and partial:
        raise ValidationError({"role": f"{deployment.name} has no {role} policy yet; PUT one "
                                       "with its signal first"})
    policy = policy or PoolPolicy(deployment=deployment, role=role)
    before = snapshot(policy, EDITABLE) if not created else {}
    unknown = set(values) - set(EDITABLE)
    if unknown:
        raise ValidationError({name: "not a policy field" for name in sorted(unknown)})
    signal_changed = "signal" in values and values["signal"] != policy.signal
    for name, value in values.items():
        setattr(policy, name, value)
    if policy.signal not in Signal.values:
        raise ValidationError({"signal": f"one of {', '.join(Signal.values)}"})
    if policy.signal == Signal.PROMPT_BACKLOG and role != "prefill":
        raise ValidationError({"signal": "the prompt backlog sizes a prefill pool; use queue, "
                                         "concurrency, kv_usage or slo for this one"})
    if created or signal_changed:
        up, down = SIGNAL_DEFAULTS[policy.signal]
        if "scale_up_at" not in values:
            policy.scale_up_at = up
        if "scale_down_at" not in values:
            policy.scale_down_at = down
    policy.full_clean()
    policy.save()
    record("autoscaling.policy.create" if created else "autoscaling.policy.update", policy,
           before=before, after=snapshot(policy, EDITABLE))
    return policy, created


@transaction.atomic
def delete_policy(policy: PoolPolicy) -> None:
    delete_recorded("autoscaling.policy.delete", policy, snapshot(policy, EDITABLE))


@transaction.atomic
def save_band(deployment: Deployment, min_ratio: float, max_ratio: float) -> RatioBand:
    if deployment.mode != Deployment.Mode.PD:
        raise ValidationError({"mode": "a ratio band needs a PD plan (prefill and decode pools)"})
    band = RatioBand.objects.filter(deployment=deployment).first()
    before = snapshot(band, ("min_ratio", "max_ratio")) if band else {}
    band = band or RatioBand(deployment=deployment)
    band.min_ratio, band.max_ratio = min_ratio, max_ratio
    band.full_clean()
    band.save()
    record("autoscaling.ratio_band.update", band, before=before,
           after=snapshot(band, ("min_ratio", "max_ratio")))
    return band


@transaction.atomic
def delete_band(band: RatioBand) -> None:
    delete_recorded("autoscaling.ratio_band.delete", band,
                    snapshot(band, ("min_ratio", "max_ratio")))
