from django.urls import path

from console.rollouts import views

urlpatterns = [
    path("deployments/<slug:name>/revisions/", views.revision_list, name="revisions"),
    path("deployments/<slug:name>/revisions/new/", views.revision_new, name="revision-new"),
    path("deployments/<slug:name>/revisions/<int:number>/rollout/", views.revision_rollout,
         name="revision-rollout"),
    path("deployments/<slug:name>/rollback/", views.deployment_rollback,
         name="deployment-rollback-page"),
    path("rollouts/<int:pk>/", views.rollout_page, name="rollout"),
    path("rollouts/<int:pk>/pause/", views.rollout_pause, name="rollout-pause"),
    path("rollouts/<int:pk>/resume/", views.rollout_resume, name="rollout-resume"),
    path("rollouts/<int:pk>/promote/", views.rollout_promote, name="rollout-promote"),
    path("rollouts/<int:pk>/rollback/", views.rollout_rollback, name="rollout-rollback"),
]
