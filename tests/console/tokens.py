"""API tokens for tests: a user's new token secret, made as the console makes one."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from console.credentials.services import create_token


def token_for(user: AbstractBaseUser, name: str = "test", lifetime_days: int | None = None) -> str:
    return create_token(user, name, lifetime_days)[1]
