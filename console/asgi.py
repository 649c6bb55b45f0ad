"""ASGI entry point: Django over HTTP; websocket routes arrive with the live views."""

import os

from channels.routing import ProtocolTypeRouter
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

# Static files are served by the console itself: users run it offline, without a web server.
application = ProtocolTypeRouter({"http": ASGIStaticFilesHandler(get_asgi_application())})
