"""``manage.py bootstrap``: the admin user and the default deployment plan, if absent."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.accounts.models import Membership, Role
from console.accounts.roles import default_team
from console.audit.actors import acting_as
from console.audit.entries import record
from console.deployments.defaults import ensure_default_deployment
from console.env import env_secret, env_str


class Command(BaseCommand):
    help = "Create the admin user and the default 1-prefill/1-decode deployment if absent."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model-dir", type=Path, default=None,
                            help="prepared model directory (default: DATA_DIR/models/...)")

    def handle(self, *args: Any, **options: Any) -> None:
        model_dir: Path | None = options["model_dir"]
        if model_dir is not None and not (model_dir / "config.json").is_file():
            raise CommandError(f"--model-dir: no config.json in {model_dir}")
        with acting_as("command", "bootstrap"):
            self._ensure_admin()
            deployment, created = ensure_default_deployment(model_dir)
            if created:
                record("deployment.create", deployment)
        verb = "created" if created else "kept"
        self.stdout.write(f"bootstrap: {verb} deployment {deployment.name}")

    def _ensure_admin(self) -> None:
        user_model = get_user_model()
        username = env_str("PDSERVE_ADMIN_USER", "admin")
        password = env_secret("PDSERVE_ADMIN_PASSWORD")
        user = user_model.objects.filter(username=username).first()
        if user is None:
            generated = not password
            password = password or secrets.token_urlsafe(12)
            user = user_model.objects.create_superuser(username=username, email="",
                                                       password=password)
            # A superuser holds every role anyway; the membership shows whose team it is.
            Membership.objects.create(team=default_team(), user=user, role=Role.ADMIN)
            record("user.create", user, after={"username": username, "is_superuser": True})
            if generated:
                # Printed once; it is stored only as a hash.
                self.stdout.write(f"bootstrap: created admin user '{username}' with password: "
                                  f"{password}")
            else:
                self.stdout.write(f"bootstrap: created admin user '{username}'")
        elif password and not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
            record("user.edit", user, before={"password": "old"}, after={"password": "new"})
            self.stdout.write(f"bootstrap: updated the password of '{username}'")
