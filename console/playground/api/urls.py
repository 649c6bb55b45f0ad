from django.urls import re_path

from console.playground.api.views import DeploymentChatView

urlpatterns = [
    re_path(r"^deployments/(?P<pk>[0-9]+)/chat/?$", DeploymentChatView.as_view(),
            name="playground-chat"),
]
