from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console.gateway.forms import ApiKeyForm
from console.gateway.models import LIMIT_FIELDS, ApiKey
from console.gateway.services import create_key, revoke_key


def _render(request: HttpRequest, form: ApiKeyForm | None = None, created: ApiKey | None = None,
            secret: str = "", status: int = 200) -> HttpResponse:
    keys = ApiKey.objects.select_related("created_by").prefetch_related("deployments")
    return render(request, "gateway/keys.html", {
        "keys": keys, "form": form or ApiKeyForm(), "created": created, "secret": secret,
    }, status=status)


@login_required
def keys(request: HttpRequest) -> HttpResponse:
    return _render(request)


@login_required
@require_POST
def key_new(request: HttpRequest) -> HttpResponse:
    form = ApiKeyForm(request.POST)
    if not form.is_valid():
        return _render(request, form, status=400)
    data = form.cleaned_data
    key, secret = create_key(name=data["name"], deployments=data["deployments"],
                             all_deployments=data["all_deployments"],
                             limits={field: data.get(field) for field in LIMIT_FIELDS},
                             user=request.user)
    # Rendered, not redirected: this answer is the only place the key ever appears, and a
    # reload must not show it again.
    response = _render(request, created=key, secret=secret, status=201)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    revoke_key(get_object_or_404(ApiKey, pk=pk))
    return redirect("keys")
