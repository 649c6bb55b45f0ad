from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from console.audit.api.views import EXPORT_FORMATS
from console.audit.forms import AuditFilterForm
from console.audit.scope import visible_entries

PAGE_SIZE = 50
# An export link asks for the API's largest page: the Link header leads on from there.
EXPORT_LIMIT = 1000


@login_required
@require_GET
def audit_log(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return render(request, "audit/log.html", {"form": form}, status=400)
    entries = form.filter(visible_entries(request.user))
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    # The filters as the user gave them, non-empty only, for the page links and the exports.
    filters = {name: request.GET[name] for name in form.fields if request.GET.get(name)}
    exports = [(fmt, f"{reverse('audit-export')}?"
                     f"{urlencode({**filters, 'format': fmt, 'limit': EXPORT_LIMIT})}")
               for fmt in EXPORT_FORMATS]
    return render(request, "audit/log.html", {
        "form": form, "page": page, "filters": urlencode(filters), "exports": exports})
