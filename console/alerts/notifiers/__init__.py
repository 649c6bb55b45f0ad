"""The notifiers, one module each behind ``sender.Sender``: the kind a Notifier row names picks
the class that sends its deliveries."""

from __future__ import annotations

from console.alerts.models import Notifier
from console.alerts.notifiers.mail import MailSender
from console.alerts.notifiers.sender import Sender, SendResult
from console.alerts.notifiers.webhook import WebhookSender

SENDERS: dict[str, type[Sender]] = {
    Notifier.Kind.WEBHOOK: WebhookSender,
    Notifier.Kind.EMAIL: MailSender,
}

__all__ = ["SENDERS", "SendResult", "Sender", "sender_for"]


def sender_for(kind: str) -> Sender:
    try:
        return SENDERS[kind]()
    except KeyError:
        raise ValueError(f"no sender for notifier kind {kind!r}; known: {', '.join(SENDERS)}") from None
