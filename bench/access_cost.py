"""What access control costs per API call, and the queries of each list page.

Builds a throwaway SQLite console (migrated, N deployments with workers and processes and one
key each) in a temporary data directory, then, in-process through Django's test client:
- times GET /api/v1/deployments/ and GET /api/v1/deployments/<id>/ for a superuser and for a
  team member (whose role is read from the database once per request);
- counts the SQL queries of every list page and list endpoint for the same users.

    .venv/bin/python bench/access_cost.py --deployments 20 --calls 200

Run it on an older checkout to compare (it leaves out what that checkout lacks: teams).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST_PATHS = ["/", "/keys/", "/models/", "/nodes/", "/api/v1/deployments/", "/api/v1/keys/",
              "/api/v1/processes/", "/api/v1/models/", "/api/v1/nodes/"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=20, help="deployments to create")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per user and path")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="pdserve-access-"))
    os.environ.update(PDSERVE_DATA_DIR=str(data), DJANGO_SETTINGS_MODULE="console.settings")
    os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    setup_test_environment()
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    call_command("migrate", verbosity=0)
    users = _populate(data, args.deployments)
    teams = "accounts" in {app.label for app in django.apps.apps.get_app_configs()}
    print(f"pdserve access cost: {args.deployments} deployments, {args.calls} calls each, "
          f"teams: {'yes' if teams else 'no (older checkout)'}")
    print(f"\n{'user':10} {'path':34} {'median ms':>10} {'p90 ms':>8}")
    first = users["root"][1]
    for who, (user, _) in users.items():
        client = Client()
        client.force_login(user)
        for path in ("/api/v1/deployments/", f"/api/v1/deployments/{first}/"):
            client.get(path)  # warm: the first call loads caches
            times = []
            for _ in range(args.calls):
                start = time.perf_counter()
                response = client.get(path)
                times.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200, (who, path, response.status_code)
            times.sort()
            print(f"{who:10} {path:34} {statistics.median(times):10.2f} "
                  f"{times[int(len(times) * 0.9)]:8.2f}")
    print(f"\n{'user':10} {'list path':34} {'queries':>8}")
    for who, (user, _) in users.items():
        client = Client()
        client.force_login(user)
        for path in LIST_PATHS:
            client.get(path)
            with CaptureQueriesContext(connection) as queries:
                response = client.get(path)
            print(f"{who:10} {path:34} {len(queries):8d}"
                  + ("" if response.status_code == 200 else f"  ({response.status_code})"))


def _populate(data: Path, count: int) -> dict[str, tuple[object, int]]:
    """A superuser, and a team viewer when the checkout has teams; ``count`` deployments."""
    from django.apps import apps
    from django.contrib.auth.models import User

    from console.deployments.defaults import ensure_default_deployment
    from console.deployments.models import Deployment, WorkerPlan
    from console.supervisor.models import ManagedProcess

    model_dir = data / "model"
    model_dir.mkdir()
    template, _ = ensure_default_deployment(model_dir=model_dir)
    root = User.objects.create_superuser("root", "", "pw")
    users: dict[str, tuple[object, int]] = {"root": (root, template.pk)}
    for n in range(count - 1):
        clone = Deployment.objects.create(name=f"d{n}", base_model=template.base_model,
                                          served_model_name=f"d{n}", router_port=20000 + n)
        for worker in template.workers.all():
            WorkerPlan.objects.create(deployment=clone, role=worker.role, variant=worker.variant,
                                      port=21000 + n * 4 + worker.index)
    for deployment in Deployment.objects.all():
        for slot in ("prefill-0", "decode-0", "router"):
            ManagedProcess.objects.create(deployment=deployment, slot=slot,
                                          role=slot.split("-")[0], port=None,
                                          state=ManagedProcess.State.READY,
                                          log_path="/nonexistent.log")
    if apps.is_installed("console.accounts"):
        from console.accounts.models import Membership, Role
        from console.accounts.roles import default_team

        viewer = User.objects.create_user("viewer", "", "pw")
        Membership.objects.create(team=default_team(), user=viewer, role=Role.VIEWER)
        users["viewer"] = (viewer, template.pk)
    return users


if __name__ == "__main__":
    main()
