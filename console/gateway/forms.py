from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from console.accounts.models import Team
from console.accounts.roles import visible, visible_teams
from console.deployments.models import Deployment
from console.gateway.models import LIMIT_FIELDS, MODEL_NAME_HELP, ApiKey, BudgetPeriod, UsageDay
from console.gateway.services import clean_model_limits
from console.gateway.usage import DIMENSIONS
from console.query_params import MAX_ID
from console.validators import since_not_after_until
from inference.gateway.flow_control import DEFAULT_BAND

DAY_FORMAT = "%Y-%m-%d"
# The usage form's filters (group_by is how, not which rows).
FILTERS = ("team", "key", "deployment", "model", "since", "until")


class ApiKeyForm(forms.ModelForm):
    deployments = forms.ModelMultipleChoiceField(
        queryset=Deployment.objects.order_by("name"), required=False,
        widget=forms.CheckboxSelectMultiple, to_field_name="name")

    class Meta:
        model = ApiKey
        fields = ["name", "team", "all_deployments", "deployments", *LIMIT_FIELDS,
                  "model_limits", "budget_tokens", "budget_period", "priority", "priority_header"]
        labels = {"all_deployments": "Valid for every deployment of its team",
                  "priority": "Priority band in the gateway's queues",
                  "priority_header": "Requests may choose their band and fairness flow",
                  "model_limits": "Limits per model", "budget_tokens": "Token budget",
                  "budget_period": "Budget period"}
        help_texts = {"model_limits": 'JSON, e.g. {"big": {"requests_per_minute": 5}}: on '
                                      "model big, 5 requests a minute instead of the key's"}
        widgets = {"model_limits": forms.Textarea(attrs={"rows": 2})}

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
        # A key without a budget needs no period: left out, it is the model's default.
        self.fields["budget_period"].required = False
        # Left out, a key's requests are of the middle band.
        self.fields["priority"].required = False

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        data["budget_period"] = data.get("budget_period") or BudgetPeriod.MONTH
        data["priority"] = data.get("priority") or DEFAULT_BAND
        if data.get("all_deployments") and data.get("deployments"):
            self.add_error("deployments", "leave empty when the key is valid for every deployment")
        elif not data.get("all_deployments") and not data.get("deployments"):
            self.add_error("deployments", "pick at least one deployment, or every deployment")
        if data.get("team") is not None and "model_limits" in data:
            try:
                data["model_limits"] = clean_model_limits(data["model_limits"] or {},
                                                          data["team"])
            except ValidationError as exc:
                self.add_error("model_limits", exc)
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


class UsageFilterForm(forms.Form):
    """The usage filters, one form for the page and the API: a bad value is an error keyed by
    its parameter (a 400 naming it). Ids are plain integers, not choices: another team's id is
    no error, it matches nothing the reader can see (the rows are scoped before filtering)."""

    team = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID,
                              help_text="a team's id")
    key = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID,
                             help_text="an API key's id")
    deployment = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID,
                                    help_text="a deployment's id")
    model = forms.CharField(required=False, max_length=100, help_text="a served model name")
    since = forms.DateField(required=False, input_formats=[DAY_FORMAT], label="From",
                            help_text="first UTC day, YYYY-MM-DD, inclusive")
    until = forms.DateField(required=False, input_formats=[DAY_FORMAT], label="To",
                            help_text="last UTC day, YYYY-MM-DD, inclusive")
    group_by = forms.CharField(required=False, max_length=100,
                               help_text=f"one or more of {', '.join(DIMENSIONS)}, separated by "
                                         "commas; default: day")

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        """``user``: the page's reader, whose teams, keys and models its selects offer."""
        super().__init__(*args, **kwargs)
        if user is None:
            return
        usage = visible(UsageDay.objects.all(), user)
        teams = visible_teams(user).order_by("name")
        keys = visible(ApiKey.objects.order_by("name"), user)
        models = sorted(set(usage.values_list("model", flat=True).distinct()))
        # Widgets only: what is accepted stays any id, as the API accepts it.
        for name, choices in (("team", [(t.pk, t.name) for t in teams]),
                              ("key", [(k.pk, f"{k.name} ({k.display_prefix})") for k in keys]),
                              ("model", [(m, m) for m in models])):
            self.fields[name].widget = forms.Select(choices=[("", "all"), *choices])
        for name in ("since", "until"):
            self.fields[name].widget = forms.DateInput(attrs={"type": "date"})

    def clean_group_by(self) -> list[str]:
        raw = self.cleaned_data.get("group_by") or "day"
        names = [name.strip() for name in raw.split(",")]
        unknown = [name for name in names if name not in DIMENSIONS]
        if unknown:
            raise forms.ValidationError(
                f"expected one or more of {', '.join(DIMENSIONS)}, got {', '.join(map(repr, unknown))}")
        if len(set(names)) != len(names):
            raise forms.ValidationError("a dimension appears twice")
        return names

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        since_not_after_until(self, data)
        return data

    def filter(self, rows: QuerySet[UsageDay]) -> QuerySet[UsageDay]:
        """``rows`` narrowed to the cleaned filters (call after ``is_valid``)."""
        data = self.cleaned_data
        for name in ("team", "key", "deployment"):
            if data.get(name) is not None:
                rows = rows.filter(**{f"{name}_id": data[name]})
        if data.get("model"):
            rows = rows.filter(model=data["model"])
        if data.get("since") is not None:
            rows = rows.filter(day__gte=data["since"])
        if data.get("until") is not None:
            rows = rows.filter(day__lte=data["until"])
        return rows

    def query(self) -> dict[str, str]:
        """The filters as given, non-empty ones only, for links that carry them."""
        return {name: str(self.data[name]) for name in FILTERS if self.data.get(name)}
