"""Database leases: one holder at a time for a loop every console process may run (the alert
evaluator, the autoscaler); the others wait for the holder's lease to lapse. A row works on
SQLite and PostgreSQL alike."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q

from console.alerts.models import EvaluatorLease


def hold(name: str, holder: str, lease_s: float, now: datetime) -> bool:
    """Take or renew the lease ``name``; False while another holder has it."""
    until = now + timedelta(seconds=lease_s)
    renewed = EvaluatorLease.objects.filter(name=name).filter(
        Q(holder=holder) | Q(expires_at__lt=now)).update(holder=holder, expires_at=until)
    if renewed:
        return True
    try:
        with transaction.atomic():
            EvaluatorLease.objects.create(name=name, holder=holder, expires_at=until)
    except IntegrityError:
        return False
    return True


def release(name: str, holder: str) -> None:
    EvaluatorLease.objects.filter(name=name, holder=holder).delete()
