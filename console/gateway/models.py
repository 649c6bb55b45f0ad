"""Inference API keys: made in the console, shown once, stored as a SHA-256 hash, scoped to
deployments, revocable, each with optional per-key limits (and per-model overrides of them) and
a token budget the routers enforce; and the teams' token budgets."""

from __future__ import annotations

import re

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from console.accounts.roles import default_team_id
from inference.gateway.flow_control import BANDS, DEFAULT_BAND
from inference.router.keys import KEY_PREFIX

LIMIT_FIELDS = ("requests_per_minute", "prompt_tokens_per_minute", "generated_tokens_per_minute",
                "max_concurrency")
LIMIT_VALIDATORS = [MinValueValidator(1), MaxValueValidator(1_000_000_000)]
# A budget of prompt + completion tokens per UTC day or calendar month (UTC).
BUDGET_VALIDATORS = [MinValueValidator(1), MaxValueValidator(10**15)]


class BudgetPeriod(models.TextChoices):
    DAY = "day", "per UTC day"
    MONTH = "month", "per calendar month (UTC)"


def _limit(help_text: str) -> models.PositiveIntegerField:
    return models.PositiveIntegerField(null=True, blank=True, validators=LIMIT_VALIDATORS,
                                       help_text=f"{help_text}; empty: unlimited")


class ApiKey(models.Model):
    name = models.CharField(max_length=100)
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="api_keys",
                             default=default_team_id,
                             help_text="the team whose deployments the key opens")
    # The public part of the key (``pds_<prefix>_...``): lists show it, the router finds the
    # key by it.
    prefix = models.CharField(max_length=8, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    all_deployments = models.BooleanField(default=False)
    deployments = models.ManyToManyField("deployments.Deployment", blank=True, related_name="api_keys")
    requests_per_minute = _limit("requests per minute")
    prompt_tokens_per_minute = _limit("prompt tokens per minute (protects prefill)")
    generated_tokens_per_minute = _limit("generated tokens per minute (protects decode)")
    max_concurrency = _limit("requests in flight at once")
    # {"<served model name>": {"requests_per_minute": 5, ...}}: on that model, each limit named
    # replaces the key's (null: unlimited there); checked by services.clean_model_limits.
    model_limits = models.JSONField(
        default=dict, blank=True,
        help_text="per served model name, limits that replace the key's on that model")
    budget_tokens = models.PositiveBigIntegerField(
        null=True, blank=True, validators=BUDGET_VALIDATORS,
        help_text="prompt + completion tokens the key may use per budget period; empty: no budget")
    # Its requests' band in the gateway's queues while a deployment is saturated (its team is
    # their fairness flow); priority_header lets a request choose a lower band or its own flow.
    priority = models.CharField(max_length=10, choices=[(band, band) for band in BANDS],
                                default=DEFAULT_BAND)
    priority_header = models.BooleanField(
        default=False, help_text="requests may set X-Pdserve-Priority (up to the key's band) and "
                                 "X-Pdserve-Fairness-Id")
    budget_period = models.CharField(max_length=5, choices=BudgetPeriod.choices,
                                     default=BudgetPeriod.MONTH)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.display_prefix})"

    @property
    def display_prefix(self) -> str:
        return f"{KEY_PREFIX}{self.prefix}…"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def state(self) -> str:
        return "revoked" if self.revoked else "active"

    def limits(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in LIMIT_FIELDS}


MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}")
MODEL_NAME_HELP = ("the name clients send as 'model': letters, digits and . _ : / -, "
                   "up to 100 characters")


class TeamBudget(models.Model):
    """A team's token budget: prompt + completion tokens of all its keys per period. (Here, not
    on Team: budgets belong to the gateway, which meters and enforces them.)"""

    team = models.OneToOneField("accounts.Team", on_delete=models.CASCADE,
                                related_name="token_budget")
    tokens = models.PositiveBigIntegerField(validators=BUDGET_VALIDATORS,
                                            help_text="prompt + completion tokens per period")
    period = models.CharField(max_length=5, choices=BudgetPeriod.choices,
                              default=BudgetPeriod.MONTH)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.team} {self.tokens} tokens per {self.period}"


class ModelAlias(models.Model):
    """Another name for one or more deployments at the gateway. With several targets they are
    tried in order: the next serves when the one before has no running router or answers that
    it cannot take the request (a fallback, as LiteLLM's ordered fallbacks)."""

    name = models.CharField(max_length=100, unique=True, help_text=MODEL_NAME_HELP)
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="aliases",
                             default=default_team_id,
                             help_text="the team whose deployments the alias names")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def target_names(self) -> list[str]:
        return [target.deployment.name for target in self.targets.all()]


class AliasTarget(models.Model):
    alias = models.ForeignKey(ModelAlias, on_delete=models.CASCADE, related_name="targets")
    # A deleted deployment leaves its aliases (only a stopped deployment can be deleted, so
    # the alias already served from the next target or answered that nothing runs).
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="alias_targets")
    position = models.PositiveSmallIntegerField()

    class Meta:
        ordering = ["alias", "position"]
        constraints = [
            models.UniqueConstraint(fields=["alias", "position"], name="alias_target_position"),
            models.UniqueConstraint(fields=["alias", "deployment"], name="alias_target_once"),
        ]


class UsageDay(models.Model):
    """What one deployment served on one UTC day under one key, as its router's usage ledger
    counts it (``GET /admin/usage``). The counters are the router's day totals, replaced on each
    read (console/gateway/usage.py says why). The names beside the links stay when a deployment,
    key or team is deleted, so that its history still reads."""

    day = models.DateField(help_text="the UTC day the answers ended on")
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.SET_NULL,
                                   null=True, blank=True, related_name="usage_days")
    deployment_name = models.CharField(max_length=100)
    key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True,
                            related_name="usage_days")
    # The key's id as the router reports it: an ApiKey's id, "console" (the playground's own
    # key) or "" (no key: an open deployment, or PDSERVE_API_KEY). A key id is not unique
    # across deployments' ledgers, but it is within one, which the constraint below needs.
    router_key = models.CharField(max_length=64, blank=True)
    key_prefix = models.CharField(max_length=8, blank=True,
                                  help_text="the key's public prefix; empty without a known key")
    # Not indexed alone: the (team, day) index below serves every lookup by team.
    team = models.ForeignKey("accounts.Team", on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="usage_days", db_index=False,
                             help_text="the key's team, or the deployment's for requests "
                                       "without a key")
    model = models.CharField(max_length=100, help_text="the deployment's served model name")
    requests = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    latency_ms_sum = models.FloatField(default=0.0)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["day", "deployment_name", "router_key"]
        constraints = [
            # Deployment first: the key sync asks, every round, for one deployment's last day
            # and its rows of the days read (console/gateway/usage.py).
            models.UniqueConstraint(fields=["deployment_name", "day", "router_key"],
                                    name="usage_day_once"),
        ]
        indexes = [
            # What readers ask: these teams, these days (the API, the page, /metrics).
            models.Index(fields=["team", "day"], name="usage_team_day"),
            models.Index(fields=["day"], name="usage_day"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.deployment_name} {self.key_prefix or self.router_key or '-'}"
