from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from console.accounts.models import Membership, Role, Team

User = get_user_model()


class TeamSerializer(serializers.ModelSerializer):
    class Meta:
        model = Team
        fields = ["id", "name", "description", "created_at"]
        read_only_fields = ["id", "created_at"]


class MemberSerializer(serializers.ModelSerializer):
    """A member of a team as listed: the user by id and name, and their role."""

    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["user", "username", "role"]
        read_only_fields = fields


class NewMemberSerializer(serializers.Serializer):
    user = serializers.SlugRelatedField(
        slug_field="username", queryset=User.objects.filter(is_active=True),
        help_text="the username of an active user")
    role = serializers.ChoiceField(choices=Role.choices, default=Role.VIEWER)


class MemberRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


def _validated_password(serializer: serializers.Serializer, password: str) -> str:
    # The console's password rules (settings.AUTH_PASSWORD_VALIDATORS), told as the field's.
    candidate = serializer.instance or User(**{
        key: value for key, value in serializer.initial_data.items()
        if key in ("username", "email") and isinstance(value, str)})
    try:
        password_validation.validate_password(password, candidate)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(list(exc.messages)) from exc
    return password


class UserSerializer(serializers.ModelSerializer):
    """A user as a superuser manages them: never the password's hash; a password only written."""

    password = serializers.CharField(write_only=True, max_length=4096, trim_whitespace=False,
                                     style={"input_type": "password"})

    class Meta:
        model = User
        fields = ["id", "username", "email", "first_name", "last_name", "is_active",
                  "is_superuser", "password", "date_joined", "last_login"]
        read_only_fields = ["id", "date_joined", "last_login"]
        extra_kwargs = {"is_active": {"default": True}, "is_superuser": {"default": False}}

    def validate_password(self, password: str) -> str:
        return _validated_password(self, password)

    def validate_username(self, username: str) -> str:
        if self.instance is not None and username != self.instance.username:
            raise serializers.ValidationError("a username is not changed: audit entries name it")
        return username

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.instance is None and data.get("is_active") is False:
            raise serializers.ValidationError({"is_active": "a new user starts active"})
        return data
