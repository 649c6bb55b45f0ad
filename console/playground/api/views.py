from __future__ import annotations

import uuid

from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.accounts.models import Role
from console.accounts.permissions import TeamRole
from console.accounts.roles import visible
from console.api_router import ID_PARAMETER
from console.deployments.models import Deployment
from console.gateway.router_admin import console_key
from console.playground.api.parsers import ChatParser
from console.playground.api.serializers import ChatRequestSerializer
from console.playground.proxy import ROUTER_MAX_BODY_BYTES, BodyTooLarge, build_body, encode_body, stream_chat


class DeploymentChatView(APIView):
    """``POST /api/v1/deployments/{id}/chat``: a streamed chat through the deployment's router.

    For the playground page (a session, with its CSRF check) or a console API token; clients
    with an inference key ask the router itself. A chat spends the team's capacity: it needs
    the operator role. A user's message may carry images as data URLs (OpenAI's content
    parts); the whole request must fit the router's body limit (4 MiB).
    """

    permission_classes = [TeamRole]
    team_roles = {"post": Role.OPERATOR}
    parser_classes = [ChatParser]
    renderer_classes = [JSONRenderer]

    def perform_content_negotiation(self, request: Request,
                                    force: bool = False) -> tuple[BaseRenderer, str]:
        # The answer is the router's stream whatever the client accepts (an SSE client asks for
        # text/event-stream); only errors are rendered, as JSON.
        return super().perform_content_negotiation(request, force=True)

    @extend_schema(
        parameters=[ID_PARAMETER],
        request=ChatRequestSerializer,
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                OpenApiTypes.STR,
                description="The router's server-sent events: chat.completion.chunk objects, "
                            "then one with usage, then `data: [DONE]`; a router that fails or "
                            "cannot be reached ends the stream with `data: {\"error\": "
                            "{\"message\": ...}}`. The header X-Request-Id names the request "
                            "for its timeline.",
                examples=[OpenApiExample("stream", value='data: {"choices": [{"index": 0, '
                                         '"delta": {"content": "Paris"}}]}\n\ndata: [DONE]\n\n')]),
            400: OpenApiResponse(description="the request's fields, each with what is wrong "
                                             "(`body` for JSON that is not an object)"),
            413: OpenApiResponse(description="the request, or the router's request made of "
                                             "it, exceeds the router's body limit; `body` says "
                                             "by how much"),
            403: OpenApiResponse(description="the user is not an operator of the team"),
            404: OpenApiResponse(description="no deployment with this id in the user's teams"),
        },
    )
    def post(self, request: Request, pk: int) -> StreamingHttpResponse | Response:
        deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
        self.check_object_permissions(request, deployment)
        sent = int(request.META.get("CONTENT_LENGTH") or 0)
        if sent > ROUTER_MAX_BODY_BYTES:
            # Refused before it is parsed: the router would refuse it anyway.
            return Response({"body": [f"the request is {sent} bytes; the router accepts at most "
                                      f"{ROUTER_MAX_BODY_BYTES} (its body limit): send fewer or "
                                      "smaller images"]},
                            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        try:
            data = request.data
        except ParseError as exc:
            return Response({"body": [f"malformed JSON: {exc.detail}"]},
                            status=status.HTTP_400_BAD_REQUEST)
        except BodyTooLarge as exc:  # a backstop: the length was checked above
            return Response({"body": [str(exc)]}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        form = ChatRequestSerializer(data=data)
        form.is_valid(raise_exception=True)
        try:
            body = encode_body(build_body(deployment, form.validated_data))
        except BodyTooLarge as exc:
            return Response({"body": [str(exc)]}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        request_id = f"playground-{uuid.uuid4().hex[:16]}"
        response = StreamingHttpResponse(
            stream_chat(deployment.router_url, body, request_id, console_key(deployment)),
            content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Request-Id"] = request_id
        return response
