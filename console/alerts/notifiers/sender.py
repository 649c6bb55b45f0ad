"""The base of every notifier: send one payload, and say how it went.

A receiver that refuses, fails or hangs is an outcome the delivery worker records and retries,
so ``send`` returns it as a ``SendResult`` rather than raising; an exception out of ``send`` is
a bug in the sender.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from console.alerts.models import Notifier


@dataclass(frozen=True)
class SendResult:
    ok: bool
    status_code: int | None = None  # the receiver's answer, when the protocol has one
    error: str = ""  # why it failed, for the attempt log; empty when ok


class Sender(ABC):
    @abstractmethod
    def send(self, payload: dict[str, Any], notifier: Notifier) -> SendResult:
        """Deliver Alertmanager's webhook payload (delivery.alertmanager_payload) to the
        notifier's receiver within ``notifier.timeout_s``."""
