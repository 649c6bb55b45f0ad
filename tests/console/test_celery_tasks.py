"""The console's Celery jobs: every module that defines a task is one the console's worker
imports (the topology advisor's speed measurement was not, so a worker answered its job with
"unregistered task" and the measurement stayed queued), and a job that cannot be queued marks
its row instead of leaving it waiting."""

from __future__ import annotations

from pathlib import Path

from celery import Celery

from console.celery import AGENT_TASK_MODULES, app, queue_or_mark
from console.verification.models import VerificationReport
from tests.console.tiny_models import make_plan

CONSOLE = Path(__file__).resolve().parents[2] / "console"


def test_the_worker_imports_every_module_with_a_task() -> None:
    defining = {".".join(path.relative_to(CONSOLE.parent).with_suffix("").parts)
                for path in CONSOLE.rglob("*.py") if "@app.task" in path.read_text()}
    assert defining - set(AGENT_TASK_MODULES) == set(app.conf.imports), defining


def test_a_job_that_cannot_be_queued_marks_its_row(db: None, tmp_path: Path) -> None:
    """A broker nobody listens on (a closed Redis port): the row is not left queued for a job
    that never comes; it carries the state asked for and the error."""
    unreachable = Celery("unreachable", broker="redis://127.0.0.1:1/0")
    unreachable.conf.broker_connection_retry = False
    unreachable.conf.broker_connection_max_retries = 0
    unreachable.conf.task_publish_retry = False

    @unreachable.task(name="test.never_runs")
    def never_runs(row_id: int) -> None:
        raise AssertionError("not queued, so never run")

    plan = make_plan(tmp_path)
    report = VerificationReport.objects.create(deployment=plan, trigger="demand", budget_s=60)
    queue_or_mark(never_runs, report.pk, VerificationReport.objects.all(),
                  state=VerificationReport.State.ERROR)
    report.refresh_from_db()
    assert report.state == VerificationReport.State.ERROR
    assert report.error.startswith("could not queue the job: "), report.error
