"""Every console module that defines a Celery task is one the console's worker imports: the
topology advisor's speed measurement was not, so a worker answered its job with "unregistered
task" and the measurement stayed queued."""

from __future__ import annotations

from pathlib import Path

from console.celery import AGENT_TASK_MODULES, app

CONSOLE = Path(__file__).resolve().parents[2] / "console"


def test_the_worker_imports_every_module_with_a_task() -> None:
    defining = {".".join(path.relative_to(CONSOLE.parent).with_suffix("").parts)
                for path in CONSOLE.rglob("*.py") if "@app.task" in path.read_text()}
    assert defining - set(AGENT_TASK_MODULES) == set(app.conf.imports), defining
