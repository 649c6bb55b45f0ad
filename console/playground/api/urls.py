from console.api_router import api_path
from console.playground.api.views import DeploymentChatView

urlpatterns = [
    api_path(r"deployments/(?P<pk>[0-9]+)/chat", DeploymentChatView.as_view(), name="playground-chat"),
]
