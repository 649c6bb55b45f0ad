from console.api_router import ID, api_path
from console.playground.api.views import DeploymentChatView

urlpatterns = [
    api_path(rf"deployments/{ID}/chat", DeploymentChatView.as_view(), name="playground-chat"),
]
