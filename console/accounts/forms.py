from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model, password_validation

from console.accounts.models import Role, Team


class TeamForm(forms.ModelForm):
    class Meta:
        model = Team
        fields = ["name", "description"]


class MemberForm(forms.Form):
    user = forms.ModelChoiceField(queryset=get_user_model().objects.filter(is_active=True)
                                  .order_by("username"), to_field_name="username")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class NewUserForm(forms.ModelForm):
    password = forms.CharField(widget=forms.PasswordInput, strip=False, max_length=4096)

    class Meta:
        model = get_user_model()
        fields = ["username", "email", "first_name", "last_name", "is_superuser"]
        labels = {"is_superuser": "Superuser (manages nodes, models, teams and users)"}
        help_texts = {"is_superuser": ""}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("password"):
            try:
                password_validation.validate_password(
                    data["password"], get_user_model()(username=data.get("username", "")))
            except forms.ValidationError as exc:
                self.add_error("password", exc)
        return data
