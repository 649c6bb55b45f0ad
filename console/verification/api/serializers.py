from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.verification.forms import MAX_BUDGET_S
from console.verification.models import VerificationReport
from console.verification.services import DEFAULT_BUDGET_S, DEFAULT_STRESS_S
from console.verification.sweep import SweepSize


class VerificationSerializer(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment.name")
    requested_by = serializers.SerializerMethodField()
    seconds = serializers.FloatField(allow_null=True)
    passing = serializers.BooleanField()

    class Meta:
        model = VerificationReport
        fields = ["id", "deployment", "deployment_id", "revision", "trigger", "state", "verdict",
                  "passing", "budget_s", "options", "progress", "sections", "comparison", "error",
                  "requested_by", "created", "started_at", "finished_at", "seconds"]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_requested_by(self, report: VerificationReport) -> str | None:
        return report.requested_by.username if report.requested_by else None


class VerifyRequestSerializer(serializers.Serializer):
    """A verification's time budget, its stress run's length and its sweep's size."""

    budget_s = serializers.IntegerField(min_value=30, max_value=MAX_BUDGET_S,
                                        default=DEFAULT_BUDGET_S)
    stress_s = serializers.IntegerField(min_value=0, max_value=MAX_BUDGET_S,
                                        default=DEFAULT_STRESS_S)
    lengths = serializers.IntegerField(min_value=1, max_value=6, default=SweepSize.lengths,
                                       help_text="input lengths of the sweep")
    concurrencies = serializers.IntegerField(min_value=1, max_value=4,
                                             default=SweepSize.concurrencies,
                                             help_text="concurrency levels of the sweep")
