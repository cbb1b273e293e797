"""Reads about projects and memberships, scoped by who asks."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import OuterRef, Prefetch, QuerySet, Subquery
from django.http import Http404

from portal.accounts.models import Membership, Project, Quota

AnyUser = User | AnonymousUser


def _is_staff(user: AnyUser) -> bool:
    return bool(getattr(user, "is_staff", False))


def _uid(user: AnyUser) -> int:
    """The user's id; 0 (no such row) for an anonymous user, who then sees nothing."""
    return int(user.pk) if user.is_authenticated and user.pk is not None else 0


def membership_role_get(user: AnyUser, *, project_id: int) -> str | None:
    """The user's role in the project (``member``/``manager``), or ``None`` if not a member."""
    if not user.is_authenticated:
        return None
    return (
        Membership.objects.filter(user_id=_uid(user), project_id=project_id)
        .values_list("role", flat=True)
        .first()
    )


def managed_project_ids(user: AnyUser) -> list[int]:
    """Ids of the projects this user manages (whose members' work they may see and manage)."""
    if not user.is_authenticated:
        return []
    return list(
        Membership.objects.filter(user_id=_uid(user), role=Membership.Role.MANAGER).values_list(
            "project_id", flat=True
        )
    )


def project_list(user: AnyUser) -> QuerySet[Project]:
    """Projects the user may see: their own, or all of them for staff.

    Each carries ``my_role`` (the user's role, ``None`` for staff outside it); quotas are prefetched.
    """
    qs = Project.objects.all() if _is_staff(user) else Project.objects.filter(memberships__user_id=_uid(user))
    role = Membership.objects.filter(user_id=_uid(user), project_id=OuterRef("pk")).values("role")[:1]
    return (
        qs.annotate(my_role=Subquery(role))
        .prefetch_related(
            Prefetch("quotas", queryset=Quota.objects.select_related("gpu_type").order_by("gpu_type__name"))
        )
        .order_by("name")
    )


def project_get(user: AnyUser, *, slug: str) -> Project:
    """One project by slug; a project the user is not in does not exist for them (404)."""
    project = project_list(user).filter(slug=slug).first()
    if project is None:
        raise Http404("No such project.")
    return project


def membership_list(user: AnyUser) -> QuerySet[Membership]:
    """The user's own memberships with their projects."""
    return Membership.objects.filter(user_id=_uid(user)).select_related("project").order_by("project__name")
