from __future__ import annotations

import uuid

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import aget_object_or_404, get_object_or_404, render
from django.views.decorators.http import require_POST

from console.deployments.models import Deployment
from console.gateway.router_admin import console_key
from console.playground.proxy import ChatInputError, build_body, stream_chat


@login_required
def playground(request: HttpRequest, name: str) -> HttpResponse:
    deployment = get_object_or_404(Deployment, name=name)
    return render(request, "playground/chat.html", {"deployment": deployment})


@require_POST
async def chat(request: HttpRequest, pk: int) -> HttpResponse:
    """``POST /api/v1/deployments/{id}/chat``: a streamed chat through the deployment's router.

    Session authentication (the playground page) with Django's CSRF check.
    """
    user = await request.auser()
    if not user.is_authenticated:
        return JsonResponse({"detail": "Authentication credentials were not provided."},
                            status=403)
    deployment = await aget_object_or_404(Deployment, pk=pk)
    try:
        body = await sync_to_async(build_body)(deployment, request.body)
    except ChatInputError as exc:
        return JsonResponse({exc.field: [str(exc)]}, status=400)
    request_id = f"playground-{uuid.uuid4().hex[:16]}"
    response = StreamingHttpResponse(
        stream_chat(deployment.router_url, body, request_id, console_key(deployment)),
        content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Request-Id"] = request_id
    return response
