"""The audit log's filters, one form for the page and the API: a bad value is an error keyed by
its parameter (a 400 naming it)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

from console.audit.models import AuditEntry
from console.validators import since_not_after_until

# An action ending in this is a prefix: "deployment." matches deployment.start and the rest.
PREFIX_END = "."


class AuditFilterForm(forms.Form):
    user = forms.CharField(required=False, max_length=150, help_text="username, exactly")
    object_type = forms.CharField(required=False, max_length=64,
                                  help_text="e.g. deployments.deployment")
    object_id = forms.CharField(required=False, max_length=64)
    action = forms.CharField(required=False, max_length=64,
                             help_text="exact (deployment.start), or a prefix ending in '.' "
                                       "(deployment.)")
    since = forms.DateTimeField(required=False, help_text="ISO 8601 time, inclusive")
    until = forms.DateTimeField(required=False, help_text="ISO 8601 time, exclusive")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        since_not_after_until(self, data)
        return data

    def filter(self, entries: QuerySet[AuditEntry]) -> QuerySet[AuditEntry]:
        """``entries`` narrowed to the form's cleaned filters (call after ``is_valid``)."""
        data = self.cleaned_data
        if data.get("user"):
            entries = entries.filter(username=data["user"])
        if data.get("object_type"):
            entries = entries.filter(object_type=data["object_type"])
        if data.get("object_id"):
            entries = entries.filter(object_id=data["object_id"])
        action = data.get("action")
        if action:
            entries = (entries.filter(action__startswith=action) if action.endswith(PREFIX_END)
                       else entries.filter(action=action))
        if data.get("since") is not None:
            entries = entries.filter(at__gte=data["since"])
        if data.get("until") is not None:
            entries = entries.filter(at__lt=data["until"])
        return entries
