"""``manage.py rollout``: list, start, inspect and move rollouts from a shell. What it changes
is the command's in the audit log."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.audit.actors import acting_as
from console.deployments.command_args import named_deployment
from console.deployments.models import Deployment
from console.rollouts import services
from console.rollouts.api.serializers import RolloutSerializer
from console.rollouts.machine import TransitionRefused
from console.rollouts.models import Rollout

MOVES = ("pause", "resume", "promote", "rollback")
FLAGS = {"revision": "--revision", "strategy": "--strategy", "steps": "--steps",
         "analysis": "--analysis", "start_timeout_s": "--start-timeout-s",
         "verify_green": "--verify-green"}


def _rollout(value: int) -> Rollout:
    found = Rollout.objects.select_related("deployment", "from_revision", "to_revision").filter(
        pk=value).first()
    if found is None:
        raise CommandError(f"ROLLOUT_ID: no rollout #{value}")
    return found


def _json(raw: str | None, flag: str) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{flag}: not JSON ({exc.msg})") from exc


def _flag(field: str) -> str:
    head = field.split(".")[0]
    return FLAGS.get(head, head)


class Command(BaseCommand):
    help = "List, start, inspect, pause, resume, promote and roll back rollouts."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True)
        listing = sub.add_parser("list", help="a deployment's rollouts, newest first")
        listing.add_argument("deployment", metavar="DEPLOYMENT")
        start = sub.add_parser("start", help="roll a revision out")
        start.add_argument("deployment", metavar="DEPLOYMENT")
        start.add_argument("--revision", type=int, required=True)
        start.add_argument("--strategy", required=True,
                           choices=list(Rollout.Strategy.values))
        start.add_argument("--steps", help='JSON: [{"weight": 10, "hold_s": 60}, ...]')
        start.add_argument("--analysis", help="JSON: interval_s, failure_limit, min_requests, "
                                              "max_inconclusive_s, metrics")
        start.add_argument("--start-timeout-s", type=int, default=None,
                           help="seconds a green worker may make no progress before the "
                                "rollout rolls back (default: 3 x the slowest recorded start, "
                                "300-3600 s)")
        start.add_argument("--verify-green", action="store_true",
                           help="drain blue only after a verification report of green alone "
                                "passed; one that does not pass rolls back")
        status = sub.add_parser("status", help="one rollout as JSON")
        status.add_argument("rollout", type=int, metavar="ROLLOUT_ID")
        for name in MOVES:
            move = sub.add_parser(name, help=f"{name} a rollout")
            move.add_argument("rollout", type=int, metavar="ROLLOUT_ID")
        back = sub.add_parser("rollback-deployment",
                              help="roll the revision live before the current one out again")
        back.add_argument("deployment", metavar="DEPLOYMENT")

    def handle(self, *args: Any, **options: Any) -> None:
        command = options["subcommand"]
        with acting_as("command", f"rollout {command}"):
            if command == "list":
                self._list(named_deployment(options["deployment"]))
            elif command == "start":
                self._start(options)
            elif command == "status":
                self._print(_rollout(options["rollout"]))
            elif command in MOVES:
                self._move(command, _rollout(options["rollout"]))
            else:
                self._rollbacknamed_deployment(named_deployment(options["deployment"]))

    def _list(self, deployment: Deployment) -> None:
        for rollout in deployment.rollouts.select_related("from_revision", "to_revision"):
            self.stdout.write(f"#{rollout.pk}  r{rollout.from_revision.number} -> "
                              f"r{rollout.to_revision.number}  {rollout.strategy:<10}  "
                              f"{rollout.state:<12}  {rollout.created:%Y-%m-%d %H:%M:%S}  "
                              f"{rollout.reason}")

    def _print(self, rollout: Rollout) -> None:
        self.stdout.write(json.dumps(RolloutSerializer(rollout).data, indent=2, default=str))

    def _start(self, options: dict[str, Any]) -> None:
        deployment = named_deployment(options["deployment"])
        revision = deployment.revisions.filter(number=options["revision"]).first()
        if revision is None:
            raise CommandError(f"--revision: {deployment.name} has no revision "
                               f"r{options['revision']}")
        steps = _json(options.get("steps"), "--steps")
        analysis = _json(options.get("analysis"), "--analysis")
        try:
            rollout = services.start(deployment, revision, options["strategy"], None,
                                     steps=steps, analysis=analysis,
                                     start_timeout_s=options.get("start_timeout_s"),
                                     verify_green=options["verify_green"])
        except services.RolloutRefused as exc:
            raise CommandError(f"{_flag(exc.field)}: {exc}" if exc.field in FLAGS
                               else str(exc)) from exc
        except ValidationError as exc:
            raise CommandError("; ".join(f"{_flag(k)} ({k}): {' '.join(v)}"
                                         for k, v in exc.message_dict.items())) from exc
        self.stdout.write(f"rollout #{rollout.pk} started: r{rollout.from_revision.number} -> "
                          f"r{rollout.to_revision.number} ({rollout.strategy}; start deadline "
                          f"{rollout.start_timeout_s} s without progress)")

    def _move(self, name: str, rollout: Rollout) -> None:
        try:
            if name == "rollback":
                moved = services.rollback(rollout, "rolled back by a command")
            else:
                moved = getattr(services, name)(rollout)
        except TransitionRefused as exc:
            raise CommandError(f"ROLLOUT_ID: {exc}") from exc
        self.stdout.write(f"rollout #{moved.pk}: {moved.state}")

    def _rollbacknamed_deployment(self, deployment: Deployment) -> None:
        try:
            rollout = services.rollback_to_previous(deployment, None)
        except services.RolloutRefused as exc:
            raise CommandError(f"DEPLOYMENT: {exc}") from exc
        self.stdout.write(f"rollout #{rollout.pk} started: r{rollout.from_revision.number} -> "
                          f"r{rollout.to_revision.number} (roll back)")
