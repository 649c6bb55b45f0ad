from __future__ import annotations

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.credentials.models import ApiToken


def lifetime_field() -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1, max_value=settings.PDSERVE_API_TOKEN_MAX_DAYS,
        default=settings.PDSERVE_API_TOKEN_DAYS,
        help_text="days until the token expires")


class ApiTokenSerializer(serializers.ModelSerializer):
    """A token as listed: never its secret, only the prefix that tells it apart."""

    username = serializers.CharField(source="user.username", read_only=True)
    state = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "user", "username", "state", "created_at", "expires_at",
                  "last_used_at", "revoked_at"]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=ApiToken.State.choices))
    def get_state(self, token: ApiToken) -> str:
        return token.state(timezone.now()).value


class NewApiTokenSerializer(serializers.Serializer):
    """What a new token is made with: a name and its lifetime."""

    name = serializers.CharField(max_length=100)
    expires_in_days = lifetime_field()


class CreatedApiTokenSerializer(ApiTokenSerializer):
    """The answer to a create: the one time the secret is shown."""

    token = serializers.SerializerMethodField(
        help_text="the secret; shown only in this answer, stored only as a hash")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields

    def get_token(self, _token: ApiToken) -> str:
        return str(self.context["secret"])


class LoginSerializer(serializers.Serializer):
    """A script's login: a new token for a username and password."""

    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, write_only=True, trim_whitespace=False,
                                     style={"input_type": "password"})
    name = serializers.CharField(max_length=100, default="login",
                                 help_text="the new token's name")
    expires_in_days = lifetime_field()


class TokenFilterSerializer(serializers.Serializer):
    """The list's query: a superuser may ask for one user's tokens."""

    # A database id: bounded by the 64-bit column, so a huge number is a 400, not an overflow.
    user = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1,
                                    help_text="only this user's tokens (superusers)")
