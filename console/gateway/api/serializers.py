from __future__ import annotations

from datetime import datetime
from typing import Any

from rest_framework import serializers

from console.accounts.models import Team
from console.accounts.roles import visible
from console.deployments.models import Deployment
from console.gateway.budgets import Spend, renews_at
from console.gateway.models import BUDGET_VALIDATORS, LIMIT_FIELDS, ApiKey, BudgetPeriod, ModelAlias
from console.gateway.usage import latency_ms_avg


class ApiKeySerializer(serializers.ModelSerializer):
    """A key as listed (never its secret), and as created or updated: name, scope, limits."""

    deployments = serializers.SlugRelatedField(
        slug_field="name", many=True, required=False, queryset=Deployment.objects.all(),
        help_text="names of the deployments the key is valid for (or set all_deployments)")
    team = serializers.SlugRelatedField(
        slug_field="name", queryset=Team.objects.all(), required=False,
        help_text="the team whose deployments the key opens; default: the one team where you "
                  "are operator")
    prefix = serializers.CharField(source="display_prefix", read_only=True)
    state = serializers.CharField(read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    # Checked against the key's team by the view (services.clean_model_limits).
    model_limits = serializers.JSONField(
        required=False,
        help_text='per served model name, limits that replace the key\'s on that model, e.g. '
                  '{"big": {"requests_per_minute": 5}} (null: unlimited on that model); the '
                  'limits a model does not name stay the key\'s, counted over all its models')
    budget_spent = serializers.SerializerMethodField(
        help_text="prompt + completion tokens the key used in the current budget period, over "
                  "every deployment, as last read from the routers (every 5 s); null without a "
                  "budget")
    budget_renews_at = serializers.SerializerMethodField(
        help_text="when the current budget period ends (UTC); null without a budget")

    class Meta:
        model = ApiKey
        fields = ["id", "name", "team", "prefix", "state", "all_deployments", "deployments",
                  *LIMIT_FIELDS, "model_limits", "budget_tokens", "budget_period",
                  "budget_spent", "budget_renews_at", "priority", "priority_header",
                  "created_at", "created_by",
                  "last_used_at", "revoked_at"]
        read_only_fields = ["created_at", "last_used_at", "revoked_at"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            # Names of deployments the caller cannot see are unknown names, not refusals.
            self.fields["deployments"].child_relation.queryset = visible(
                Deployment.objects.all(), request.user)

    def validate_team(self, team: Team) -> Team:
        if self.instance is not None and team.pk != self.instance.team_id:
            raise serializers.ValidationError("a key stays in its team; make a new key instead")
        return team

    def get_budget_spent(self, key: ApiKey) -> int | None:
        spent: Spend | None = self.context.get("spend")
        if key.budget_tokens is None or spent is None:
            return None
        return spent.key(key.pk)

    def get_budget_renews_at(self, key: ApiKey) -> datetime | None:
        spent: Spend | None = self.context.get("spend")
        if key.budget_tokens is None or spent is None:
            return None
        return renews_at(spent.periods[key.budget_period])

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        instance: ApiKey | None = self.instance
        all_deployments = attrs.get("all_deployments",
                                    instance.all_deployments if instance is not None else False)
        if "deployments" in attrs:
            deployments = attrs["deployments"]
        else:
            deployments = list(instance.deployments.all()) if instance is not None else []
        if all_deployments and deployments:
            raise serializers.ValidationError(
                {"deployments": "leave empty when all_deployments is true"})
        if not all_deployments and not deployments:
            raise serializers.ValidationError(
                {"deployments": "name at least one deployment, or set all_deployments to true"})
        return attrs


class CreatedApiKeySerializer(ApiKeySerializer):
    """The answer to a create: the one time the full key is shown."""

    key = serializers.SerializerMethodField(
        help_text="the full key; shown only in this answer, stored only as a hash")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]

    def get_key(self, _obj: ApiKey) -> str:
        return str(self.context["secret"])


class TeamBudgetSerializer(serializers.Serializer):
    """A team's token budget: prompt + completion tokens of all its keys per UTC day or calendar
    month, what they spent in the current period, and when it renews; the fields are named as
    a key's budget is. Written with PUT/PATCH, removed with DELETE."""

    team = serializers.CharField(read_only=True, help_text="the team's name")
    budget_tokens = serializers.IntegerField(
        min_value=BUDGET_VALIDATORS[0].limit_value, max_value=BUDGET_VALIDATORS[1].limit_value,
        allow_null=True, help_text="prompt + completion tokens per period; null: no budget")
    # Null in a team without a budget, as the other fields are; never taken as input.
    budget_period = serializers.ChoiceField(choices=BudgetPeriod.choices,
                                            default=BudgetPeriod.MONTH, allow_null=True,
                                            help_text="day or month; null: no budget")
    budget_spent = serializers.IntegerField(
        read_only=True, allow_null=True,
        help_text="tokens the team's keys used in the current period, over every deployment, as "
                  "last read from the routers (every 5 s); null without a budget")
    budget_renews_at = serializers.DateTimeField(read_only=True, allow_null=True,
                                                 help_text="when the current period ends (UTC)")

    def to_representation(self, instance: Team) -> dict[str, Any]:
        budget = getattr(instance, "token_budget", None)
        spent: Spend | None = self.context.get("spend")
        if budget is None or spent is None:
            return {"team": instance.name, "budget_tokens": None, "budget_period": None,
                    "budget_spent": None, "budget_renews_at": None}
        return {"team": instance.name, "budget_tokens": budget.tokens,
                "budget_period": budget.period, "budget_spent": spent.team(instance.pk),
                "budget_renews_at": renews_at(spent.periods[budget.period]).isoformat()}

    def validate_budget_tokens(self, tokens: int | None) -> int:
        if tokens is None:
            raise serializers.ValidationError("give a number of tokens; DELETE removes a budget")
        return tokens

    def validate_budget_period(self, period: str | None) -> str:
        if period is None:
            raise serializers.ValidationError("give day or month; DELETE removes a budget")
        return period


class ModelAliasSerializer(serializers.ModelSerializer):
    """An alias: its name at the gateway and the deployments it names, in fallback order."""

    team = serializers.SlugRelatedField(
        slug_field="name", queryset=Team.objects.all(), required=False,
        help_text="the team whose deployments it names; default: the one team where you are "
                  "operator")
    # Written as names; read back by to_representation, in their order.
    targets = serializers.ListField(
        child=serializers.CharField(max_length=100), allow_empty=False, write_only=True,
        help_text="deployment names, tried in this order (the next serves when one has no "
                  "running router or cannot take the request)")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ModelAlias
        fields = ["id", "name", "team", "targets", "created_at", "created_by"]
        read_only_fields = ["created_at"]
        # The name's rules and uniqueness are the service's (console/gateway/aliases.py).
        extra_kwargs = {"name": {"validators": []}}

    def to_representation(self, instance: ModelAlias) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["targets"] = instance.target_names()
        return data

    def validate_team(self, team: Team) -> Team:
        if self.instance is not None and team.pk != self.instance.team_id:
            raise serializers.ValidationError("an alias stays in its team; make a new one instead")
        return team

    def validate_targets(self, names: list[str]) -> list[Deployment]:
        request = self.context.get("request")
        deployments = Deployment.objects.all()
        if request is not None:
            # Names of deployments the caller cannot see are unknown names, not refusals.
            deployments = visible(deployments, request.user)
        found = {d.name: d for d in deployments.filter(name__in=names)}
        unknown = [name for name in names if name not in found]
        if unknown:
            raise serializers.ValidationError(f"no such deployment: {', '.join(unknown)}")
        return [found[name] for name in names]


class UsageRowSerializer(serializers.Serializer):
    """One group of stored usage: the fields of the dimensions grouped by (those of the others
    are left out), then the group's sums."""

    day = serializers.DateField(required=False, help_text="the UTC day (group_by day)")
    team = serializers.IntegerField(required=False, allow_null=True,
                                    help_text="the team's id (group_by team)")
    team_name = serializers.CharField(required=False, allow_null=True)
    key = serializers.IntegerField(required=False, allow_null=True,
                                   help_text="the API key's id; null without a key the console "
                                             "knows (group_by key)")
    key_prefix = serializers.CharField(
        required=False, help_text="the key's public prefix; 'console0' for the playground's "
                                  "key, empty for requests without a key")
    key_name = serializers.CharField(required=False, allow_null=True)
    model = serializers.CharField(required=False, help_text="served model name (group_by model)")
    deployment = serializers.IntegerField(required=False, allow_null=True,
                                          help_text="the deployment's id; null once deleted "
                                                    "(group_by deployment)")
    deployment_name = serializers.CharField(required=False)
    requests = serializers.IntegerField()
    errors = serializers.IntegerField(help_text="answered >= 400, or a stream that failed")
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    latency_ms_avg = serializers.SerializerMethodField(
        help_text="mean time from arrival to the end of the answer, in ms; null without requests")

    def get_latency_ms_avg(self, row: dict[str, Any]) -> float | None:
        return latency_ms_avg(row)

    def to_representation(self, instance: dict[str, Any]) -> dict[str, Any]:
        data = super().to_representation(instance)
        # DRF fills a nullable field the row lacks with null: a dimension not grouped by is
        # left out instead, so that null keeps meaning "no key", "deleted deployment".
        return {name: value for name, value in data.items()
                if name in instance or name == "latency_ms_avg"}


class QueueWaitingSerializer(serializers.Serializer):
    band = serializers.CharField(help_text="priority band: high, normal or low")
    flow = serializers.CharField(help_text="fairness flow: the key's team, or what a key "
                                           "allowed to send X-Pdserve-Fairness-Id set")
    requests = serializers.IntegerField()


class FlowInFlightSerializer(serializers.Serializer):
    flow = serializers.CharField(help_text="fairness flow: the key's team, or what a key "
                                           "allowed to send X-Pdserve-Fairness-Id set")
    requests = serializers.IntegerField(help_text="its requests in flight: the slots it holds")


class DeploymentTrafficSerializer(serializers.Serializer):
    deployment = serializers.CharField()
    model = serializers.CharField(help_text="its served model name")
    rps = serializers.FloatField(allow_null=True, help_text="requests through the gateway per "
                                 "second, refusals included (the latest 1 s snapshot)")
    shed_ps = serializers.FloatField(allow_null=True, help_text="requests the gateway's queue "
                                     "refused per second (shed, or timed out waiting)")
    in_flight = serializers.IntegerField(allow_null=True, help_text="requests the gateway has "
                                         "in flight to it, over every replica read; null when "
                                         "it has no queue")
    limit = serializers.IntegerField(allow_null=True, help_text="requests in flight past which "
                                     "the gateway queues (the plan's concurrency times the "
                                     "ready workers that generate), the replicas' shares added")
    waiting = QueueWaitingSerializer(many=True)
    in_flight_by_flow = FlowInFlightSerializer(many=True, help_text="the slots each fairness "
                                               "flow holds; empty when it has no queue")


class GatewayTrafficSerializer(serializers.Serializer):
    gateway = serializers.CharField(help_text="running, off, unreachable: <why> (no replica "
                                    "answered), or running; unreachable: <replica>: <why>")
    deployments = DeploymentTrafficSerializer(many=True)
