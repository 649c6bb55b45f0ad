from __future__ import annotations

from django import forms

from console.verification.services import DEFAULT_BUDGET_S, DEFAULT_STRESS_S

MAX_BUDGET_S = 3600


class VerifyForm(forms.Form):
    """The deployment page's "Verify now": the defaults unless the operator asks otherwise."""

    budget_s = forms.IntegerField(min_value=30, max_value=MAX_BUDGET_S, required=False,
                                  initial=DEFAULT_BUDGET_S)
    stress_s = forms.IntegerField(min_value=0, max_value=MAX_BUDGET_S, required=False,
                                  initial=DEFAULT_STRESS_S)
