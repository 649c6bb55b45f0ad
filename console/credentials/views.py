from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console.credentials.forms import NewApiTokenForm
from console.credentials.models import ApiToken
from console.credentials.services import create_token, revoke_token

PAGE_SIZE = 50


def _render(request: HttpRequest, form: NewApiTokenForm | None = None,
            created: ApiToken | None = None, secret: str = "", status: int = 200) -> HttpResponse:
    now = timezone.now()
    # Every script login makes a token: a long-lived account collects many.
    page = Paginator(ApiToken.objects.filter(user=request.user), PAGE_SIZE).get_page(
        request.GET.get("page"))
    return render(request, "credentials/tokens.html", {
        "tokens": [(token, token.state(now)) for token in page], "page": page,
        "form": form or NewApiTokenForm(), "created": created, "secret": secret,
    }, status=status)


@login_required
@require_GET
def tokens(request: HttpRequest) -> HttpResponse:
    return _render(request)


@login_required
@require_POST
def token_new(request: HttpRequest) -> HttpResponse:
    form = NewApiTokenForm(request.POST)
    if not form.is_valid():
        return _render(request, form, status=400)
    token, secret = create_token(request.user, form.cleaned_data["name"],
                                 form.cleaned_data["expires_in_days"])
    # Rendered, not redirected: this answer is the only place the secret ever appears, and a
    # reload must not show it again.
    response = _render(request, created=token, secret=secret, status=201)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    # Only one's own: another user's token is as absent as one that never existed.
    revoke_token(get_object_or_404(ApiToken, pk=pk, user=request.user))
    return redirect("api-tokens")
