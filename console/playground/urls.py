from django.urls import path

from console.playground import views

urlpatterns = [
    path("deployments/<slug:name>/playground/", views.playground, name="playground"),
    path("playground/", views.gateway_playground, name="gateway-playground"),
]
