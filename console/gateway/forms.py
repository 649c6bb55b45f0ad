from __future__ import annotations

from typing import Any

from django import forms

from console.deployments.models import Deployment
from console.gateway.models import LIMIT_FIELDS, ApiKey


class ApiKeyForm(forms.ModelForm):
    deployments = forms.ModelMultipleChoiceField(
        queryset=Deployment.objects.order_by("name"), required=False,
        widget=forms.CheckboxSelectMultiple, to_field_name="name")

    class Meta:
        model = ApiKey
        fields = ["name", "all_deployments", "deployments", *LIMIT_FIELDS]
        labels = {"all_deployments": "Valid for every deployment"}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("all_deployments") and data.get("deployments"):
            self.add_error("deployments", "leave empty when the key is valid for every deployment")
        elif not data.get("all_deployments") and not data.get("deployments"):
            self.add_error("deployments", "pick at least one deployment, or every deployment")
        return data
