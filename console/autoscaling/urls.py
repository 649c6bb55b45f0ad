from django.urls import path

from console.autoscaling import views

urlpatterns = [
    path("deployments/<slug:name>/autoscaling/", views.autoscaling_page, name="autoscaling"),
    path("deployments/<slug:name>/autoscaling/<slug:role>/", views.policy_edit,
         name="autoscaling-policy"),
    path("deployments/<slug:name>/autoscaling/<slug:role>/mode/", views.policy_mode,
         name="autoscaling-mode"),
]
