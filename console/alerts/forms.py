from __future__ import annotations

import json
from typing import Any

from django import forms

from console.alerts import series as catalog
from console.alerts.models import AlertRule, AlertState, Notifier, Severity

RULE_FIELDS = ["deployment", "name", "enabled", "series", "role", "aggregation", "window_s",
               "comparison", "threshold", "for_s", "keep_firing_for_s", "severity", "scope",
               "labels", "summary", "runbook_url", "min_count", "nodata", "inhibits"]


class JsonField(forms.CharField):
    """A JSON value typed into a text area; the API's serializer judges its shape."""

    widget = forms.Textarea(attrs={"rows": 2, "cols": 60})

    def prepare_value(self, value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not JSON: {exc.msg}") from exc


class AlertRuleForm(forms.ModelForm):
    """What the rule page shows; the API's AlertRuleSerializer validates what is posted, so a
    page and a script get the same errors."""

    series = forms.ChoiceField(choices=[(name, f"{name} — {s.help}")
                                        for name, s in sorted(catalog.SERIES.items())])
    labels = JsonField(required=False, help_text='e.g. {"team": "serving"}')
    inhibits = JsonField(required=False, help_text='matchers of the alerts it mutes, e.g. '
                                                   '[{"name": "category", "op": "=", "value": "latency"}]')

    class Meta:
        model = AlertRule
        fields = RULE_FIELDS


class SilenceFromAlertForm(forms.Form):
    minutes = forms.IntegerField(min_value=1, max_value=60 * 24 * 30, initial=60)
    comment = forms.CharField(max_length=500)


class AcknowledgeForm(forms.Form):
    comment = forms.CharField(max_length=500, required=False)


class HistoryFilterForm(forms.Form):
    deployment = forms.CharField(required=False)
    severity = forms.ChoiceField(required=False, choices=[("", "any"), *Severity.choices])
    state = forms.ChoiceField(required=False, choices=[("", "any"), *AlertState.choices])
    rule = forms.IntegerField(required=False, min_value=1)
    since = forms.DateTimeField(required=False)
    until = forms.DateTimeField(required=False)


class NotifierForm(forms.ModelForm):
    recipients = JsonField(required=False, help_text='email addresses, e.g. ["ops@example.com"]')

    class Meta:
        model = Notifier
        fields = ["team", "name", "kind", "enabled", "url", "recipients", "send_resolved",
                  "send_resolved_when_silenced", "min_severity", "timeout_s", "max_attempts"]

