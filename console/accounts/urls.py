from django.urls import path

from console.accounts import views

urlpatterns = [
    path("teams/", views.teams, name="teams"),
    path("teams/<slug:name>/", views.team_page, name="team-page"),
    path("teams/<slug:name>/edit/", views.team_edit, name="team-edit"),
    path("teams/<slug:name>/delete/", views.team_delete, name="team-delete"),
    path("teams/<slug:name>/members/", views.member_add, name="member-add"),
    path("teams/<slug:name>/members/<int:user_id>/role/", views.member_role, name="member-role"),
    path("teams/<slug:name>/members/<int:user_id>/remove/", views.member_remove,
         name="member-remove"),
    path("users/", views.users, name="users"),
    path("users/<int:pk>/deactivate/", views.user_deactivate, name="user-deactivate"),
    path("users/<int:pk>/activate/", views.user_activate, name="user-activate"),
]
