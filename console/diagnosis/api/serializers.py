"""The shape of the troubleshooting view's answer, for the OpenAPI schema: services.report
writes the object itself (tests/console/test_doctor.py holds it to this shape)."""

from __future__ import annotations

from rest_framework import serializers

from console.diagnosis.symptoms import SOURCE_CHOICES, STATE_CHOICES


class SymptomEvidenceSerializer(serializers.Serializer):
    text = serializers.CharField()
    source = serializers.ChoiceField(choices=SOURCE_CHOICES)
    at = serializers.DateTimeField(allow_null=True)
    url = serializers.CharField(allow_blank=True, help_text="the page or API path that shows it")
    strong = serializers.BooleanField(help_text="it proves the symptom (else: suspected)")


class SymptomFixSerializer(serializers.Serializer):
    text = serializers.CharField()
    target = serializers.CharField(help_text="plan:<field>, page:<page> or settings:<variable>")
    url = serializers.CharField(allow_blank=True, help_text="where the fix is applied")


class SymptomCauseSerializer(serializers.Serializer):
    id = serializers.CharField()
    text = serializers.CharField()
    score = serializers.FloatField(help_text="how much of the evidence points at it")
    fixes = SymptomFixSerializer(many=True)


class SymptomSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="the anchor of its section on the page")
    title = serializers.CharField()
    state = serializers.ChoiceField(choices=STATE_CHOICES)
    evidence = SymptomEvidenceSerializer(many=True)
    causes = SymptomCauseSerializer(many=True, help_text="the likely causes, the likeliest first")


class DoctorReportSerializer(serializers.Serializer):
    deployment = serializers.IntegerField()
    name = serializers.CharField()
    evaluated_at = serializers.DateTimeField()
    state = serializers.ChoiceField(choices=STATE_CHOICES,
                                    help_text="the worst of the symptoms' states")
    symptoms = SymptomSerializer(many=True)
