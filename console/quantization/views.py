from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console.catalog.forms import QuantizeForm
from console.catalog.models import BaseModel, QuantizationJob
from console.catalog.views import page_context, require_superuser
from console.quantization.jobs import JobError, cancel_job, start_job


@login_required
@require_POST
def quantize(request: HttpRequest, pk: int) -> HttpResponse:
    require_superuser(request)
    base = get_object_or_404(BaseModel, pk=pk)
    form = QuantizeForm(request.POST, prefix=f"quantize-{base.pk}")
    if form.is_valid():
        options = {key: value for key, value in form.cleaned_data.items() if value not in (None, "")}
        try:
            start_job(base, **options)
        except JobError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        else:
            return redirect("catalog")
    return render(request, "catalog/models.html",
                  page_context(request, quantize_form=form, quantize_base=base.pk), status=400)


@login_required
@require_POST
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    require_superuser(request)
    try:
        cancel_job(get_object_or_404(QuantizationJob, pk=pk))
    except JobError:
        pass  # it finished meanwhile: the table shows how
    return redirect("catalog")
