"""Permissions, generated from the URL list: every page and API path of the console, in the
style of healthchecks' owner/teammate/outsider tests.

- anonymous: 401 from the API, a redirect to the login page from a page;
- a viewer of the team: 403 on every unsafe method (405 where the path has no such method);
- an outsider (another team's admin): 404 on every object of the team, and none of its names
  in a list.

A path that is not classified in ``KINDS`` fails: a new endpoint must say who may call it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.console.url_list import UNSAFE, fill, is_api, placeholders, templates
from tests.console.world import ALPHA_NAMES, World

PUBLIC = "public"        # no sign-in: the login page, the token exchange, the schema
SELF = "self"            # the caller's own things (their API tokens): any signed-in user
TEAM = "team"            # a team's objects: members by role, outsiders see nothing
SHARED = "shared"        # nodes, models, variants, jobs: read by all, changed by a superuser
SUPERUSER = "superuser"  # users: a superuser's alone

KINDS: dict[str, str] = {
    "": TEAM,
    "login/": PUBLIC,
    "logout/": PUBLIC,
    "api/schema/": PUBLIC,
    "api/v1/auth/token/": PUBLIC,
    "api/v1/": SHARED,
    "metrics/": TEAM,
    "alerts/": TEAM,
    "alerts/history/": TEAM,
    "alerts/notifiers/": TEAM,
    "alerts/notifiers/new/": TEAM,
    "alerts/notifiers/{pk}/delete/": TEAM,
    "alerts/rules/": TEAM,
    "alerts/rules/new/": TEAM,
    "alerts/rules/preview/": TEAM,
    "alerts/rules/{pk}/": TEAM,
    "alerts/rules/{pk}/delete/": TEAM,
    "alerts/silences/": TEAM,
    "alerts/silences/{pk}/expire/": TEAM,
    "alerts/{pk}/": TEAM,
    "alerts/{pk}/acknowledge/": TEAM,
    "alerts/{pk}/row/": TEAM,
    "alerts/{pk}/series/": TEAM,
    "alerts/{pk}/silence/": TEAM,
    "api/v1/alert-events/": TEAM,
    "api/v1/alert-rules.yaml/": TEAM,
    "api/v1/alert-rules/": TEAM,
    "api/v1/alert-rules/preview/": TEAM,
    "api/v1/alert-rules/{pk}/": TEAM,
    "api/v1/alerts/": TEAM,
    "api/v1/alerts/{pk}/": TEAM,
    "api/v1/alerts/{pk}/acknowledge/": TEAM,
    "api/v1/deliveries/": TEAM,
    "api/v1/deliveries/{pk}/": TEAM,
    "api/v1/deployments/{pk}/alert-rules.yaml/": TEAM,
    "api/v1/notifiers/": TEAM,
    "api/v1/notifiers/{pk}/": TEAM,
    "api/v1/silences/": TEAM,
    "api/v1/silences/{pk}/": TEAM,
    "api/v1/silences/{pk}/expire/": TEAM,
    "api/v1/audit/": TEAM,
    "api/v1/audit/export/": TEAM,
    "api/v1/audit/{pk}/": TEAM,
    "audit/": TEAM,
    "api/v1/deployments/": TEAM,
    "api/v1/deployments/{pk}/": TEAM,
    "api/v1/deployments/{pk}/chat/": TEAM,
    "api/v1/deployments/{pk}/check/": TEAM,
    "api/v1/deployments/{pk}/doctor/": TEAM,
    "api/v1/deployments/{pk}/gate/": TEAM,
    "api/v1/deployments/{pk}/verifications/": TEAM,
    "api/v1/verifications/": TEAM,
    "api/v1/verifications/{pk}/": TEAM,
    "api/v1/verifications/{pk}/export.html/": TEAM,
    "deployments/{name}/verify/": TEAM,
    "verifications/{pk}/": TEAM,
    "verifications/{pk}/panel/": TEAM,
    "api/v1/deployments/{pk}/metrics/": TEAM,
    "api/v1/deployments/{pk}/start/": TEAM,
    "api/v1/deployments/{pk}/stop/": TEAM,
    "api/v1/gate-results/": TEAM,
    "api/v1/gate-results/{pk}/": TEAM,
    "api/v1/keys/": TEAM,
    "api/v1/keys/{pk}/": TEAM,
    "api/v1/keys/{pk}/revoke/": TEAM,
    "api/v1/aliases/": TEAM,
    "api/v1/aliases/{pk}/": TEAM,
    "api/v1/usage/": TEAM,
    "api/v1/usage/export.csv/": TEAM,
    "api/v1/gateway/traffic/": TEAM,
    "api/v1/team-budgets/": TEAM,
    "api/v1/team-budgets/{name}/": TEAM,
    "api/v1/measurements/": SHARED,
    "api/v1/measurements/{pk}/": SHARED,
    "api/v1/models/": SHARED,
    "api/v1/models/{pk}/": SHARED,
    "api/v1/nodes/": SHARED,
    "api/v1/nodes/discover/": SHARED,
    "api/v1/nodes/{pk}/": SHARED,
    "api/v1/processes/": TEAM,
    "api/v1/processes/{pk}/": TEAM,
    "api/v1/processes/{pk}/logs/": TEAM,
    "api/v1/processes/{pk}/logs/download/": TEAM,
    "api/v1/quantization-jobs/": SHARED,
    "api/v1/quantization-jobs/{pk}/": SHARED,
    "api/v1/quantization-jobs/{pk}/cancel/": SHARED,
    "api/v1/teams/": TEAM,
    "api/v1/teams/{pk}/": TEAM,
    "api/v1/teams/{pk}/members/": TEAM,
    "api/v1/teams/{pk}/members/{user_id}/": TEAM,
    "api/v1/tokens/": SELF,
    "api/v1/tokens/{pk}/": SELF,
    "api/v1/tokens/{pk}/revoke/": SELF,
    "api/v1/users/": SUPERUSER,
    "api/v1/users/{pk}/": SUPERUSER,
    "api/v1/variants/": SHARED,
    "api/v1/variants/{pk}/": SHARED,
    "api/v1/variants/{pk}/inspect/": SHARED,
    "deployments/new/": TEAM,
    "deployments/new/check/": TEAM,
    "deployments/new/propose/": TEAM,
    "deployments/{name}/": TEAM,
    "deployments/{name}/advice/": TEAM,
    "deployments/{name}/advice/measure/": TEAM,
    "deployments/{name}/checks/": TEAM,
    "deployments/{name}/dashboard/": TEAM,
    "deployments/{name}/doctor/": TEAM,
    "deployments/{name}/edit/": TEAM,
    "deployments/{name}/edit/check/": TEAM,
    "deployments/{name}/edit/propose/": TEAM,
    "deployments/{name}/gate/": TEAM,
    "deployments/{name}/gate/run/": TEAM,
    "deployments/{name}/playground/": TEAM,
    "playground/": TEAM,
    "deployments/{name}/processes/": TEAM,
    "deployments/{name}/requests/": TEAM,
    "deployments/{name}/start/": TEAM,
    "deployments/{name}/stop/": TEAM,
    "deployments/{name}/revisions/": TEAM,
    "deployments/{name}/revisions/new/": TEAM,
    "deployments/{name}/revisions/{number}/rollout/": TEAM,
    "deployments/{name}/rollback/": TEAM,
    "deployments/{name}/autoscaling/": TEAM,
    "deployments/{name}/autoscaling/{role}/": TEAM,
    "deployments/{name}/autoscaling/{role}/mode/": TEAM,
    "rollouts/{pk}/": TEAM,
    "rollouts/{pk}/pause/": TEAM,
    "rollouts/{pk}/resume/": TEAM,
    "rollouts/{pk}/promote/": TEAM,
    "rollouts/{pk}/rollback/": TEAM,
    "api/v1/deployments/{pk}/revisions/": TEAM,
    "api/v1/deployments/{pk}/rollback/": TEAM,
    "api/v1/deployments/{pk}/autoscaling/": TEAM,
    "api/v1/deployments/{pk}/autoscaling/ratio-band/": TEAM,
    "api/v1/deployments/{pk}/autoscaling/ratio-band/from-advice/": TEAM,
    "api/v1/deployments/{pk}/autoscaling/{role}/": TEAM,
    "api/v1/deployments/{pk}/scaling-decisions/": TEAM,
    "api/v1/rollouts/": TEAM,
    "api/v1/deployments/{pk}/advice/": TEAM,
    "api/v1/deployments/{pk}/advice/apply/": TEAM,
    "api/v1/deployments/{pk}/advice/measure/": TEAM,
    "deployments/{name}/topology/": TEAM,
    "deployments/{name}/topology/apply/": TEAM,
    "deployments/{name}/topology/measure/": TEAM,
    "deployments/{name}/topology/measurement/": TEAM,
    "api/v1/rollouts/{pk}/": TEAM,
    "api/v1/rollouts/{pk}/pause/": TEAM,
    "api/v1/rollouts/{pk}/resume/": TEAM,
    "api/v1/rollouts/{pk}/promote/": TEAM,
    "api/v1/rollouts/{pk}/rollback/": TEAM,
    "keys/": TEAM,
    "keys/new/": TEAM,
    "keys/{pk}/revoke/": TEAM,
    "gateway/": TEAM,
    "gateway/aliases/new/": TEAM,
    "gateway/aliases/{pk}/delete/": TEAM,
    "usage/": TEAM,
    "models/": SHARED,
    "models/jobs/": SHARED,
    "models/jobs/{pk}/cancel/": SHARED,
    "models/new/": SHARED,
    "models/register/": SHARED,
    "models/variants/": SHARED,
    "models/variants/{pk}/inspect/": SHARED,
    "models/{pk}/quantize/": SHARED,
    "nodes/": SHARED,
    "nodes/discover/": SHARED,
    "nodes/new/": SHARED,
    "nodes/{pk}/delete/": SHARED,
    "processes/{process_id}/log/": TEAM,
    "teams/": TEAM,
    "teams/{name}/": TEAM,
    "teams/{name}/delete/": TEAM,
    "teams/{name}/edit/": TEAM,
    "teams/{name}/members/": TEAM,
    "teams/{name}/members/{user_id}/remove/": TEAM,
    "teams/{name}/members/{user_id}/role/": TEAM,
    "tokens/": SELF,
    "tokens/new/": SELF,
    "tokens/{pk}/revoke/": SELF,
    "users/": SUPERUSER,
    "users/{pk}/activate/": SUPERUSER,
    "users/{pk}/deactivate/": SUPERUSER,
}


def values(world: World, template: str) -> dict[str, object]:
    """The placeholders of ``template`` filled with alpha's objects (the viewer's own token and
    account where the path is about a user)."""
    segments = template.strip("/").split("/")
    filled: dict[str, object] = {}
    for name in placeholders(template):
        before = segments[segments.index("{" + name + "}") - 1]
        filled[name] = _value(world, before, name)
    return filled


def _value(world: World, resource: str, name: str) -> object:
    by_resource: dict[str, Any] = {
        "deployments": world.deployment.name if name == "name" else world.deployment.pk,
        "keys": world.key.pk, "aliases": world.alias.pk, "audit": world.entry_id,
        "teams": world.alpha.name if name == "name" else world.alpha.pk,
        "members": world.viewer.pk, "users": world.viewer.pk, "tokens": world.viewer_token_id,
        "models": world.base_model.pk, "variants": world.variant.pk, "jobs": world.job.pk,
        "quantization-jobs": world.job.pk, "nodes": world.node.pk,
        "processes": world.process.pk, "gate-results": world.gate.pk,
        "measurements": world.measurement.pk, "alert-rules": world.alert_rule.pk,
        "alerts": world.alert.pk, "silences": world.silence.pk, "notifiers": world.notifier.pk,
        "deliveries": world.delivery.pk, "rules": world.alert_rule.pk,
        "rollouts": world.rollout.pk if world.rollout else None,
        "revisions": world.revision.number if world.revision else None,
        "autoscaling": "decode",
        "verifications": world.verification.pk if world.verification else None,
        "team-budgets": world.alpha.name,
    }
    if resource not in by_resource:
        raise AssertionError(f"no object for {{{name}}} after {resource}/: add it to _value")
    return by_resource[resource]


def client_for(world: World, who: str | None, template: str) -> Client:
    """A page client signed in with a session, an API client with the user's token (a session
    would meet CSRF first and hide what the permission says)."""
    if who is None:
        return Client()
    if is_api(template):
        return Client(headers={"Authorization": f"Token {world.tokens[who]}"})
    client = Client()
    client.force_login(world.user(who))
    return client


def call(client: Client, method: str, url: str) -> int:
    if method in ("get", "delete"):
        return getattr(client, method)(url).status_code
    return getattr(client, method)(url, data={}, content_type="application/json").status_code \
        if url.startswith("/api/") else getattr(client, method)(url, data={}).status_code


ALL = templates()


def test_every_path_says_who_may_call_it() -> None:
    unclassified = [t for t in ALL if t not in KINDS]
    assert not unclassified, f"classify these paths in KINDS (and guard them): {unclassified}"
    gone = sorted(set(KINDS) - set(ALL))
    assert not gone, f"KINDS names paths that no longer exist: {gone}"


@pytest.mark.parametrize("template", [t for t in ALL if KINDS.get(t) != PUBLIC])
def test_anonymous_is_refused(world: World, template: str) -> None:
    url = fill(template, values(world, template))
    client = client_for(world, None, template)
    for method in ("get", "post"):
        response = getattr(client, method)(url)
        if is_api(template):
            assert response.status_code == 401, f"{method.upper()} {url}: {response.status_code}"
        else:
            assert response.status_code == 302, f"{method.upper()} {url}: {response.status_code}"
            assert response["Location"].startswith("/login/"), response["Location"]


@pytest.mark.parametrize("template", [t for t in ALL if KINDS.get(t) not in (PUBLIC, SELF)])
def test_a_viewer_changes_nothing(world: World, template: str) -> None:
    url = fill(template, values(world, template))
    client = client_for(world, "viewer", template)
    answers = {method: call(client, method, url) for method in UNSAFE}
    assert set(answers.values()) <= {403, 405}, f"{url} as a viewer: {answers}"
    if KINDS[template] == SUPERUSER:
        assert call(client, "get", url) in (403, 405), f"GET {url} as a viewer"


OBJECT_PATHS = [t for t in ALL if KINDS.get(t) == TEAM and placeholders(t)]
LIST_PATHS = [t for t in ALL if KINDS.get(t) == TEAM and not placeholders(t)]


@pytest.mark.parametrize("template", OBJECT_PATHS)
def test_an_outsider_finds_no_object_of_the_team(world: World, template: str) -> None:
    url = fill(template, values(world, template))
    client = client_for(world, "outsider", template)
    answers = {method: call(client, method, url) for method in ("get", *UNSAFE)}
    assert set(answers.values()) <= {404, 405}, f"{url} as an outsider: {answers}"
    assert 404 in answers.values(), f"{url} as an outsider: {answers}"


@pytest.mark.parametrize("template", LIST_PATHS)
def test_an_outsider_reads_no_name_of_the_team(world: World, template: str) -> None:
    url = fill(template, {})
    response = client_for(world, "outsider", template).get(url)
    if response.status_code == 405:
        return
    assert response.status_code == 200, f"GET {url} as an outsider: {response.status_code}"
    body = b"".join(response.streaming_content) if response.streaming else response.content
    text = body.decode(errors="replace")
    leaked = [name for name in ALPHA_NAMES if name in text]
    assert not leaked, f"GET {url} shows an outsider {leaked}"


@pytest.mark.parametrize("template", [t for t in ALL if KINDS.get(t) == SELF and placeholders(t)])
def test_no_one_reaches_anothers_own_things(world: World, template: str) -> None:
    url = fill(template, values(world, template))  # the viewer's token
    client = client_for(world, "admin", template)   # alpha's admin, not the token's owner
    answers = {method: call(client, method, url) for method in ("get", *UNSAFE)}
    assert set(answers.values()) <= {404, 405}, f"{url} as another user: {answers}"
    assert 404 in answers.values(), f"{url} as another user: {answers}"
