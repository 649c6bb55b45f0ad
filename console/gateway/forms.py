from __future__ import annotations

from typing import Any

from django import forms

from console.accounts.models import Team
from console.accounts.roles import visible
from console.deployments.models import Deployment
from console.gateway.models import LIMIT_FIELDS, MODEL_NAME_HELP, ApiKey


class ApiKeyForm(forms.ModelForm):
    deployments = forms.ModelMultipleChoiceField(
        queryset=Deployment.objects.order_by("name"), required=False,
        widget=forms.CheckboxSelectMultiple, to_field_name="name")

    class Meta:
        model = ApiKey
        fields = ["name", "team", "all_deployments", "deployments", *LIMIT_FIELDS]
        labels = {"all_deployments": "Valid for every deployment of its team"}

    def __init__(self, *args: Any, user: Any, teams: list[Team], **kwargs: Any) -> None:
        """``teams``: those where ``user`` may make keys."""
        if args and args[0] is not None and len(teams) == 1 and not args[0].get("team"):
            # One team to choose from: the form may leave it out.
            data = args[0].copy()
            data["team"] = str(teams[0].pk)
            args = (data, *args[1:])
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = Team.objects.filter(pk__in=[t.pk for t in teams])
        if len(teams) == 1:
            self.fields["team"].initial = teams[0].pk
        self.fields["deployments"].queryset = visible(
            Deployment.objects.order_by("name"), user)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("all_deployments") and data.get("deployments"):
            self.add_error("deployments", "leave empty when the key is valid for every deployment")
        elif not data.get("all_deployments") and not data.get("deployments"):
            self.add_error("deployments", "pick at least one deployment, or every deployment")
        return data


class ModelAliasForm(forms.Form):
    name = forms.CharField(max_length=100, help_text=MODEL_NAME_HELP)
    team = forms.ModelChoiceField(queryset=Team.objects.none())
    targets = forms.CharField(
        max_length=900, label="Deployments, in fallback order",
        help_text="deployment names separated by commas: the first serves, the next when it "
                  "cannot")

    def __init__(self, *args: Any, user: Any, teams: list[Team], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["team"].queryset = Team.objects.filter(pk__in=[t.pk for t in teams])
        if len(teams) == 1:
            self.fields["team"].initial = teams[0].pk

    def clean_targets(self) -> list[Deployment]:
        names = [name.strip() for name in self.cleaned_data["targets"].split(",") if name.strip()]
        found = {d.name: d for d in visible(Deployment.objects.filter(name__in=names), self.user)}
        unknown = [name for name in names if name not in found]
        if unknown:
            raise forms.ValidationError(f"no such deployment: {', '.join(unknown)}")
        return [found[name] for name in names]
