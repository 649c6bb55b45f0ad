"""The email notifier: one plain-text message per delivery through Django's mail backend.

The subject is Alertmanager's default one, ``[FIRING:2] WorkerDown demo (critical)``: the status,
how many alerts fire, the group's label values, then the labels the alerts share beyond the
group's. The body is its default email's content in plain text, read from the same version 4
payload the webhook sends, so both notifiers always say the same thing.
"""

from __future__ import annotations

import smtplib
from typing import Any

from django.core.mail import EmailMessage, get_connection

from console.alerts.models import Notifier
from console.alerts.notifiers.sender import Sender, SendResult
from console.alerts.symptom_links import doctor_path_of

ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time: Alertmanager's endsAt of a firing alert


class MailSender(Sender):
    def send(self, payload: dict[str, Any], notifier: Notifier) -> SendResult:
        recipients = [str(address) for address in notifier.recipients]
        if not recipients:
            return SendResult(ok=False, error="the notifier has no recipients")
        # The SMTP backend applies the timeout to each socket operation, not to the whole
        # conversation; the delivery worker's claim allows for a few of them.
        connection = get_connection(timeout=notifier.timeout_s)
        message = EmailMessage(subject=subject(payload), body=body(payload), to=recipients,
                               connection=connection)
        try:
            message.send()
        except smtplib.SMTPResponseException as exc:
            return SendResult(ok=False, status_code=exc.smtp_code,
                              error=f"SMTP {exc.smtp_code}: {_text(exc.smtp_error)}")
        except smtplib.SMTPRecipientsRefused as exc:
            refused = ", ".join(f"{address} ({code} {_text(reason)})"
                                for address, (code, reason) in exc.recipients.items())
            return SendResult(ok=False, error=f"recipients refused: {refused}")
        except (smtplib.SMTPException, OSError) as exc:
            return SendResult(ok=False, error=f"{type(exc).__name__}: {exc}")
        return SendResult(ok=True)


def subject(payload: dict[str, Any]) -> str:
    status = payload["status"]
    head = status.upper()
    if status == "firing":
        head += f":{sum(1 for alert in payload['alerts'] if alert['status'] == 'firing')}"
    group = payload["groupLabels"]
    text = f"[{head}] " + " ".join(value for _name, value in _sorted_pairs(group))
    extra = {name: value for name, value in payload["commonLabels"].items() if name not in group}
    if extra:
        text += " (" + " ".join(value for _name, value in _sorted_pairs(extra)) + ")"
    return text


def body(payload: dict[str, Any]) -> str:
    alerts = payload["alerts"]
    group = " ".join(f"{name}={value}" for name, value in _sorted_pairs(payload["groupLabels"]))
    lines = [f"{len(alerts)} alert{'s' if len(alerts) != 1 else ''} for {group}",
             f"View in pdserve: {payload['externalURL']}/alerts/", ""]
    for status in ("firing", "resolved"):
        chosen = [alert for alert in alerts if alert["status"] == status]
        if not chosen:
            continue
        lines.append(f"[{len(chosen)}] {status.capitalize()}")
        for alert in chosen:
            lines.append("Labels:")
            lines += [f"  {name} = {value}" for name, value in _sorted_pairs(alert["labels"])]
            if alert["annotations"]:
                lines.append("Annotations:")
                lines += [f"  {name} = {value}"
                          for name, value in sorted(alert["annotations"].items())]
            lines.append(f"Starts at: {alert['startsAt']}")
            ends = alert["endsAt"]
            lines.append(f"Ends at: {'still firing' if ends == ZERO_TIME else ends}")
            lines.append(f"Source: {alert['generatorURL']}")
            doctor = doctor_path_of(alert["labels"])
            if doctor:
                lines.append(f"Troubleshoot: {payload['externalURL']}{doctor}")
            lines.append("")
    return "\n".join(lines)


def _sorted_pairs(labels: dict[str, str]) -> list[tuple[str, str]]:
    """Alertmanager's order: ``alertname`` first, then the other names sorted."""
    return sorted(labels.items(), key=lambda pair: (pair[0] != "alertname", pair[0]))


def _text(reply: bytes | str) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else reply
