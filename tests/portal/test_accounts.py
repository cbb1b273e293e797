"""Project, membership and quota services and selectors."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.http import Http404

from portal.accounts import selectors, services
from portal.accounts.models import Membership
from tests.factories import GpuTypeFactory, ProjectFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_project_create_slugifies_and_refuses_duplicates():
    project = services.project_create(name="Speech Lab", fair_share_weight=2.0)
    assert project.slug == "speech-lab"
    with pytest.raises(ValidationError) as info:
        services.project_create(name="Speech Lab")
    assert "slug" in info.value.message_dict
    with pytest.raises(ValidationError) as info:
        services.project_create(name="Zero", fair_share_weight=0)
    assert "fair_share_weight" in info.value.message_dict


def test_membership_set_is_idempotent_and_changes_roles():
    project = ProjectFactory()
    user = UserFactory()
    services.membership_set(project=project, user=user)
    services.membership_set(project=project, user=user, role=Membership.Role.MANAGER)
    assert Membership.objects.get(user=user, project=project).role == Membership.Role.MANAGER
    assert selectors.managed_project_ids(user) == [project.pk]
    assert selectors.membership_role_get(user, project_id=project.pk) == "manager"
    with pytest.raises(ValidationError):
        services.membership_set(project=project, user=user, role="owner")


def test_quota_set_and_max_gpus():
    project = ProjectFactory()
    a100 = GpuTypeFactory(name="A100")
    quota = services.quota_set(project=project, gpu_type=a100, guaranteed_gpus=4, borrow_limit_gpus=2)
    assert quota.max_gpus == 6
    quota = services.quota_set(project=project, gpu_type=a100, guaranteed_gpus=4, borrow_limit_gpus=None)
    assert quota.max_gpus is None
    assert project.quotas.count() == 1
    with pytest.raises(ValidationError) as info:
        services.quota_set(project=project, gpu_type=a100, guaranteed_gpus=-1)
    assert "guaranteed_gpus" in info.value.message_dict


def test_project_selectors_scope_by_membership():
    mine, other = ProjectFactory(slug="mine"), ProjectFactory(slug="other")
    user = UserFactory()
    services.membership_set(project=mine, user=user)
    assert [p.slug for p in selectors.project_list(user)] == ["mine"]
    assert selectors.project_list(user).get().my_role == "member"
    assert selectors.project_get(user, slug="mine") == mine
    with pytest.raises(Http404):
        selectors.project_get(user, slug="other")
    staff = UserFactory(is_staff=True)
    assert {p.slug for p in selectors.project_list(staff)} == {"mine", "other"}
    assert selectors.project_get(staff, slug="other") == other
