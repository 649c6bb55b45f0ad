"""ASGI entry point: Django over HTTP, Channels consumers over websockets."""

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
# Django must be set up before the routing imports models.
django_http = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.alerts.alert_socket import websocket_urlpatterns as alert_sockets  # noqa: E402
from console.live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    # Static files are served by the console itself: users run it offline, without a web server.
    "http": ASGIStaticFilesHandler(django_http),
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(
        URLRouter([*websocket_urlpatterns, *alert_sockets]))),
})
