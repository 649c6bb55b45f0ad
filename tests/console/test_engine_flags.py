"""Extra engine flags: read as vLLM reads them, refused by class, and the same role rule on every
path that writes them into a plan (plan create and edit, draft by API and page, rollout)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client

from console.accounts.models import Membership, Role, Team
from console.deployments.engine_args import canonical, given_flags, keeping_environment
from console.deployments.engine_flags import CLASSES, FlagClass
from console.deployments.models import Deployment
from console.rollouts import revisions
from console.rollouts.models import Revision, Rollout
from tests.console.team_users import token_client
from tests.console.tiny_models import free_port, make_plan, make_startable
from tests.console.tokens import token_for

# Spellings vLLM's parser takes for flags pdserve owns, that a check by spelling let through.
BYPASSES = [
    (["--chat_template=/proc/self/environ"], "--chat_template", "--chat-template"),
    (["--tensor_parallel_size", "8"], "--tensor_parallel_size", "--tensor-parallel-size"),
    (["--kv-transfer-config.kv_connector=X"], "--kv-transfer-config.kv_connector",
     "--kv-transfer-config"),
    (["--hos=0.0.0.0"], "--hos", "--host"),
    (["--max-num-seqs", "4", "-tp=2"], "-tp", "--tensor-parallel-size"),
    (["--port=9000"], "--port", "--port"),
    (["--enable-prefix-caching", "serve-this"], '"serve-this"', "model_tag"),
]
# Flags that read a file, load code or change trust: a superuser's.
SUPERUSER_FLAGS = [
    (["--tool-parser-plugin", "file.py"], "--tool-parser-plugin"),
    (["--trust-remote-code"], "--trust-remote-code"),
    (["--trust_remote_code"], "--trust-remote-code"),
    (["--middleware", "evil.Middleware"], "--middleware"),
    (["--logits-processors", "evil:Processor"], "--logits-processors"),
    (["--allowed-local-media-path", "/"], "--allowed-local-media-path"),
    (["--download-dir", "/tmp"], "--download-dir"),
    (["--hf-token", "hf_x"], "--hf-token"),
    (["--worker-extension-cls", "evil.Ext"], "--worker-extension-cls"),
]
TUNING = ["--max-num-seqs", "64", "--enable-prefix-caching", "--gpu-memory-utilization", "0.8"]


def vllm_serve_flags() -> set[str]:
    """Every flag of vLLM's own `vllm serve` parser, named as the table names them."""
    with keeping_environment():
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

    return {canonical(action) for action in make_arg_parser(FlexibleArgumentParser())._actions}


def test_every_vllm_serve_flag_is_classified_and_the_table_names_no_other() -> None:
    flags = vllm_serve_flags()
    assert len(flags) > 200  # the whole parser, not an empty one
    assert sorted(flags - set(CLASSES)) == [], "classify these in engine_flags.py"
    assert sorted(set(CLASSES) - flags) == [], "vLLM no longer has these: drop them"
    assert {kind for kind in CLASSES.values()} == set(FlagClass)


@pytest.mark.parametrize(("args", "written", "flag"), BYPASSES)
def test_each_spelling_vllm_takes_is_refused_by_its_canonical_name(
        args: list[str], written: str, flag: str) -> None:
    with pytest.raises(ValidationError) as refused:
        given_flags(args)
    message = " ".join(refused.value.messages)
    assert written in message and flag in message, message


@pytest.mark.parametrize(("args", "problem"), [
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--max", "3"], "ambiguous option: --max"),
    (["--config", "options.yaml"], "--config"),
    (["--help"], "--help"),
    (["--max-num-seqs", "many"], "--max-num-seqs: invalid value 'many'"),
    (["--scheduling-policy", "lottery"], "'lottery' is not one of"),
    (["max-num-seqs", "4"], "the first argument must be a flag"),
    ("--max-num-seqs 4", "expected a list"),
])
def test_unknown_flags_and_bad_values_are_refused(args: Any, problem: str) -> None:
    with pytest.raises(ValidationError) as refused:
        given_flags(args)
    assert problem in " ".join(refused.value.messages)


def test_reading_flags_leaves_the_processes_environment_alone() -> None:
    # In a fresh process: importing vLLM sets torch's variables, which the supervisor's workers
    # would inherit from a console process that checked a plan.
    script = ("import os, django\n"
              "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'console.settings')\n"
              "django.setup()\n"
              "before = dict(os.environ)\n"
              "from console.deployments.engine_args import given_flags\n"
              "assert given_flags(['--max-num-seqs', '4'])[0].flag == '--max-num-seqs'\n"
              "import vllm\n"
              "assert dict(os.environ) == before, set(os.environ) ^ set(before)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_forms_vllm_accepts_map_to_one_flag() -> None:
    seen = [(g.written, g.flag, g.kind) for g in given_flags(
        ["--max_num_seqs=8", "--no-enable-prefix-caching", "-O3", "--max-num-batch", "2k"])]
    assert seen == [("--max_num_seqs", "--max-num-seqs", FlagClass.TUNING),
                    ("--no-enable-prefix-caching", "--enable-prefix-caching", FlagClass.TUNING),
                    ("-O3", "--optimization-level", FlagClass.TUNING),
                    ("--max-num-batch", "--max-num-batched-tokens", FlagClass.TUNING)]


# ---- the paths that write flags into a plan --------------------------------------------------


@pytest.fixture
def team(db: None) -> Team:
    return Team.objects.create(name="flag-team")


def member(team: Team, role: Role, name: str) -> User:
    user = User.objects.create_user(name, "", "pw")
    Membership.objects.create(team=team, user=user, role=role)
    return user


def client_of(user: User) -> Client:
    return Client(headers={"Authorization": f"Token {token_for(user)}"})


@pytest.fixture
def admin(team: Team) -> User:
    return member(team, Role.ADMIN, "flag-admin")


@pytest.fixture
def operator(team: Team) -> Client:
    return token_client(team, Role.OPERATOR, "flag-op")


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser("flag-root", "", "pw")


@pytest.fixture
def plan(team: Team, tmp_path: Path) -> Deployment:
    """A running plan: its edits of revision fields become drafts."""
    deployment = make_startable(make_plan(tmp_path, team=team))
    Deployment.objects.filter(pk=deployment.pk).update(
        desired_state=Deployment.DesiredState.RUNNING)
    deployment.refresh_from_db()
    revisions.ensure_live(deployment)
    return deployment


def post(client: Client, url: str, body: dict[str, Any]) -> Any:
    return client.post(url, data=body, content_type="application/json")


def patch(client: Client, url: str, body: dict[str, Any]) -> Any:
    return client.patch(url, data=body, content_type="application/json")


def draft(client: Client, plan: Deployment, args: list[str]) -> Any:
    return post(client, f"/api/v1/deployments/{plan.pk}/revisions/",
                {"extra_engine_args": args})


def refused_naming(response: Any, *names: str) -> bool:
    body = response.json()
    message = " ".join(body.get("extra_engine_args", []))
    return response.status_code == 400 and all(name in message for name in names)


def new_plan_body(plan: Deployment, args: list[str]) -> dict[str, Any]:
    variant = plan.workers.get(role="prefill").variant
    return {"name": "flags-new", "team": plan.team.name, "base_model": "tiny",
            "served_model_name": "tiny", "max_model_len": 2048, "longest_request": 1024,
            "prefill": {"variant": variant.pk, "instances": [{}]},
            "decode": {"variant": variant.pk, "instances": [{}]},
            "router": {"port": free_port()}, "extra_engine_args": args}


@pytest.mark.parametrize(("args", "written", "flag"), BYPASSES)
def test_a_bypass_spelling_is_400_on_every_path(plan: Deployment, admin: User,
                                                operator: Client, root: User, args: list[str],
                                                written: str, flag: str) -> None:
    before = Revision.objects.count()
    for client in (operator, client_of(admin), client_of(root)):
        assert refused_naming(draft(client, plan, args), written, flag)
    for client in (client_of(admin), client_of(root)):
        assert refused_naming(patch(client, f"/api/v1/deployments/{plan.pk}/",
                                    {"extra_engine_args": args}), written, flag)
        assert refused_naming(post(client, "/api/v1/deployments/",
                                   new_plan_body(plan, args)), written, flag)
    assert Revision.objects.count() == before
    assert not Deployment.objects.filter(name="flags-new").exists()


@pytest.mark.parametrize(("args", "flag"), SUPERUSER_FLAGS)
def test_file_and_code_flags_are_a_superusers(plan: Deployment, admin: User, operator: Client,
                                              root: User, args: list[str], flag: str) -> None:
    for client in (operator, client_of(admin)):
        assert refused_naming(draft(client, plan, args), flag, "superuser")
    assert refused_naming(post(client_of(admin), "/api/v1/deployments/",
                               new_plan_body(plan, args)), flag, "superuser")
    made = draft(client_of(root), plan, args)
    assert made.status_code == 201, made.content
    assert made.json()["created_by"] == "flag-root"


def test_tuning_flags_are_a_team_admins(plan: Deployment, admin: User,
                                        operator: Client) -> None:
    assert refused_naming(draft(operator, plan, TUNING), "--max-num-seqs", "admin role")
    made = draft(client_of(admin), plan, TUNING)
    assert made.status_code == 201, made.content
    created = post(client_of(admin), "/api/v1/deployments/", new_plan_body(plan, TUNING))
    assert created.status_code == 201, created.content
    # An operator may still draft other fields of a plan whose flags stay as they are.
    Deployment.objects.filter(pk=plan.pk).update(extra_engine_args=TUNING)
    assert post(operator, f"/api/v1/deployments/{plan.pk}/revisions/",
                {"block_size": 32}).status_code == 201


def test_only_changed_flags_need_the_role(plan: Deployment, admin: User, root: User) -> None:
    stopped = Deployment.objects.filter(pk=plan.pk)
    stopped.update(desired_state=Deployment.DesiredState.STOPPED)
    url = f"/api/v1/deployments/{plan.pk}/"
    assert patch(client_of(root), url, {"extra_engine_args": ["--trust-remote-code"]}
                 ).status_code == 200
    # Written another way, the flag does not change: the admin may keep it and add tuning.
    kept = patch(client_of(admin), url,
                 {"extra_engine_args": ["--trust_remote_code", "--max-num-seqs", "8"]})
    assert kept.status_code == 200, kept.content
    assert refused_naming(patch(client_of(admin), url, {"extra_engine_args": []}),
                          "--trust-remote-code", "removing")
    assert stopped.get().extra_engine_args == ["--trust_remote_code", "--max-num-seqs", "8"]


def rollout(client: Client, plan: Deployment, number: int) -> Any:
    return post(client, "/api/v1/rollouts/", {"deployment": plan.name, "revision": number,
                                              "strategy": "blue_green"})


def test_a_superusers_draft_may_be_rolled_out_by_an_operator(plan: Deployment, root: User,
                                                             operator: Client) -> None:
    made = draft(client_of(root), plan, ["--trust-remote-code"])
    started = rollout(operator, plan, made.json()["number"])
    assert started.status_code == 201, started.content
    assert Rollout.objects.get(pk=started.json()["id"]).to_revision.created_by.username \
        == "flag-root"


def test_a_rollout_cannot_smuggle_flags(plan: Deployment, team: Team, admin: User,
                                        operator: Client) -> None:
    # A draft whose author no longer holds the role, and one written around the API.
    made = draft(client_of(admin), plan, TUNING)
    assert made.status_code == 201, made.content
    Membership.objects.filter(user=admin).update(role=Role.OPERATOR)
    assert refused_naming(rollout(operator, plan, made.json()["number"]), "--max-num-seqs")
    assert refused_naming(rollout(client_of(admin), plan, made.json()["number"]),
                          "--max-num-seqs")
    operator_user = User.objects.get(username="flag-op")
    live = revisions.live(plan)
    assert live is not None
    forged = Revision.objects.create(
        deployment=plan, number=live.number + 10, state=Revision.State.DRAFT,
        created_by=operator_user,
        spec={**live.spec, "extra_engine_args": ["--tool-parser-plugin", "x.py"]})
    assert refused_naming(rollout(operator, plan, forged.number), "--tool-parser-plugin")
    # Owned flags: nobody's, not even a draft without an author (a command's).
    owned = Revision.objects.create(
        deployment=plan, number=live.number + 11, state=Revision.State.DRAFT,
        created_by=None, spec={**live.spec, "extra_engine_args": ["--hos=0.0.0.0"]})
    assert refused_naming(rollout(operator, plan, owned.number), "--hos", "--host")
    assert not Rollout.objects.filter(deployment=plan).exists()


def test_the_draft_page_refuses_too(plan: Deployment, team: Team) -> None:
    user = member(team, Role.OPERATOR, "flag-page-op")
    page = Client()
    page.force_login(user)
    before = Revision.objects.count()
    for args in ('["--max_num_seqs", "4"]', '["--hos=0.0.0.0"]', '["--trust-remote-code"]'):
        response = page.post(f"/deployments/{plan.name}/revisions/new/",
                             {"extra_engine_args": args})
        assert response.status_code == 400
        assert args.split('"')[1].split("=")[0] in response.content.decode()
    assert Revision.objects.count() == before


def test_a_running_plans_edit_cannot_draft_what_its_author_may_not_set(
        plan: Deployment, admin: User) -> None:
    response = patch(client_of(admin), f"/api/v1/deployments/{plan.pk}/",
                     {"extra_engine_args": ["--tool-parser-plugin", "file.py"]})
    assert refused_naming(response, "--tool-parser-plugin")
    edited = patch(client_of(admin), f"/api/v1/deployments/{plan.pk}/",
                   {"extra_engine_args": TUNING})
    assert edited.status_code == 202, edited.content  # a draft, to roll out
