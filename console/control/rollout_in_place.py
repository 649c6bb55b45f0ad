"""The in-place strategy's part of the rollout runner (console/control/rollout_runner.py): one
prefill+decode pair at a time changes hands on its own ports. Going forward, blue's pair drains
and stops, then green's starts there; rolling back, the same pair by pair in reverse, so that
one pair at least serves throughout."""

from __future__ import annotations

from typing import Any

from console.control.worker_specs import green_slot, green_workers
from console.rollouts import services
from console.rollouts.machine import move
from console.rollouts.models import Rollout
from console.supervisor.models import ManagedProcess

State = Rollout.State


class InPlace:
    def _releasing(self, rollout: Rollout) -> bool:
        """Blue's pair ``step_index`` drains and stops (the reconcile leaves it out, the pool
        sync drains it), then green's starts on its ports."""
        unit = rollout.step_index
        units = dict(rollout.units)
        if units.get("transit") != unit:
            units["transit"] = unit
            weights = self._capacity_weights(rollout, units)
            Rollout.objects.filter(pk=rollout.pk).update(units=units, weights=weights)
            rollout.units, rollout.weights = units, weights
            self._sync_router(rollout)
            return True
        if self._alive(rollout, self._blue_slots(rollout, unit)):
            return False
        units = {"green": sorted({*units.get("green", []), unit}), "transit": None}
        move(rollout, State.STARTING, f"blue's pair {unit + 1} stopped; green's starts on its "
             "ports", units=units)
        return True

    def _in_place_back(self, rollout: Rollout) -> bool:
        """Rolling back in place: pair by pair from the last green took, green's drains and
        stops and blue's starts again on its ports; one pair at least serves throughout."""
        units = dict(rollout.units)
        green = list(units.get("green", []))
        transit = units.get("transit")
        if transit is not None and transit not in green:
            if self._alive(rollout, self._green_slots(rollout, transit)):
                return False
            if not self._ready(rollout, self._blue_slots(rollout, transit)):
                return False  # blue's pair is back in the plan's reconcile: wait until it serves
            units = {"green": green, "transit": None}
            weights = self._capacity_weights(rollout, units)
            Rollout.objects.filter(pk=rollout.pk).update(units=units, weights=weights)
            rollout.units, rollout.weights = units, weights
            self._put_router_weights(rollout)
            return True
        if green:
            unit = max(green)
            units = {"green": [u for u in green if u != unit], "transit": unit}
            weights = self._capacity_weights(rollout, units)
            Rollout.objects.filter(pk=rollout.pk).update(units=units, weights=weights)
            rollout.units, rollout.weights = units, weights
            self._put_router_weights(rollout)
            self._remove_members(rollout, self._green_urls(rollout, unit))
            return True
        return self._rolling_back(rollout)

    def _capacity_weights(self, rollout: Rollout, units: dict[str, Any]) -> dict[str, int]:
        """Each colour's share of the pairs that serve (the one in transit serves neither)."""
        total = len(services.pairs(rollout.deployment))
        green = len(units.get("green", []))
        blue = total - green - (1 if units.get("transit") is not None else 0)
        if green + blue == 0:
            return dict(rollout.weights)
        return {rollout.blue.label: round(100 * blue / (green + blue)),
                rollout.green.label: round(100 * green / (green + blue))}

    @staticmethod
    def _blue_slots(rollout: Rollout, unit: int) -> list[str]:
        return [w.slot for w in rollout.deployment.workers.filter(index=unit)]

    def _green_slots(self, rollout: Rollout, unit: int) -> list[str]:
        return [green_slot(slot, rollout.green) for slot in self._blue_slots(rollout, unit)]

    @staticmethod
    def _green_urls(rollout: Rollout, unit: int) -> list[tuple[str, str]]:
        return [(w.role, w.url) for w in green_workers(rollout.deployment, rollout)
                if w.index == unit]

    @staticmethod
    def _alive(rollout: Rollout, slots: list[str]) -> bool:
        return ManagedProcess.objects.filter(deployment=rollout.deployment_id, slot__in=slots,
                                             state__in=ManagedProcess.ALIVE_STATES).exists()

    @staticmethod
    def _ready(rollout: Rollout, slots: list[str]) -> bool:
        return ManagedProcess.objects.filter(
            deployment=rollout.deployment_id, slot__in=slots,
            state=ManagedProcess.State.READY).count() == len(slots)

