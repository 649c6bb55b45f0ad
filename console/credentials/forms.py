from __future__ import annotations

from django import forms
from django.conf import settings


class NewApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    expires_in_days = forms.IntegerField(
        label="Expires in (days)", min_value=1, max_value=settings.PDSERVE_API_TOKEN_MAX_DAYS,
        initial=settings.PDSERVE_API_TOKEN_DAYS)
