from django.urls import path, re_path

from console.playground import views

urlpatterns = [
    path("deployments/<slug:name>/playground/", views.playground, name="playground"),
    re_path(r"^api/v1/deployments/(?P<pk>[0-9]+)/chat/?$", views.chat, name="playground-chat"),
]
