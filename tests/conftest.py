"""Small fixtures shared by the database tests: one cluster of A100 nodes and a project member."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from portal.accounts.models import Membership, Project
from scheduling.models import Cluster, GpuType, Node
from tests.factories import (
    ClusterFactory,
    GpuTypeFactory,
    MembershipFactory,
    NodeFactory,
    ProjectFactory,
    UserFactory,
)

# The OpenID Connect provider of the single sign-on tests (session scope, started on first use).
from tests.oidc_provider.fixtures import oidc_provider  # noqa: F401


@pytest.fixture(autouse=True)
def _skip_slurm_without_slurm(request: pytest.FixtureRequest) -> None:
    """Every test marked ``slurm``, wherever it lives, is skipped without the local Slurm (a
    module that imported another's fixtures but not its skip ran, and its teardown started
    slurmctld on a machine without ``BERTH_SLURM``)."""
    if request.node.get_closest_marker("slurm") and not os.environ.get("BERTH_SLURM"):
        pytest.skip(
            "needs the local Slurm: run `scripts/slurm.sh start` and set BERTH_SLURM=1 (make test does)"
        )


@pytest.fixture
def a100() -> GpuType:
    return GpuTypeFactory(name="A100", memory_gib=80.0, precisions=["fp64", "tf32", "bf16", "fp16"])


@pytest.fixture
def cluster() -> Cluster:
    return ClusterFactory(name="alpha")


@pytest.fixture
def nodes(cluster: Cluster, a100: GpuType) -> list[Node]:
    """Two up nodes of four A100s each: eight bookable GPUs."""
    return [NodeFactory(cluster=cluster, gpu_type=a100, name=f"a{i}", gpu_count=4) for i in range(2)]


@pytest.fixture
def project() -> Project:
    return ProjectFactory(name="Vision", slug="vision")


@pytest.fixture
def member(project: Project) -> User:
    return MembershipFactory(project=project, role=Membership.Role.MEMBER).user


@pytest.fixture
def manager(project: Project) -> User:
    return MembershipFactory(project=project, role=Membership.Role.MANAGER).user


@pytest.fixture
def outsider() -> User:
    """A signed-in user in another project."""
    return MembershipFactory().user


@pytest.fixture
def staff() -> User:
    return UserFactory(is_staff=True)


@pytest.fixture
def staff_web(client: Client, staff: User) -> Client:
    """The test client signed in as a staff (operations) user."""
    client.force_login(staff)
    return client


@pytest.fixture
def soon() -> datetime:
    """A whole hour a little ahead, so windows are valid but not in the past."""
    return (timezone.now() + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)


def token_client(user: User) -> APIClient:
    """An API client authenticated with a real DRF token (the way scripts call the API)."""
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def member_client(member: User) -> APIClient:
    return token_client(member)


@pytest.fixture(autouse=True)
def _fast_password_hashing(request: pytest.FixtureRequest) -> None:
    """PBKDF2 costs ~0.1-0.3 s per user on this machine; database tests create dozens of users.

    Only for tests marked ``django_db``: pure engine and core tests stay free of Django fixtures.
    """
    if request.node.get_closest_marker("django_db") is None:
        return
    request.getfixturevalue("settings").PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's, and the availability listener's own connection (`scheduling.selectors`)
    closed before the test database is dropped (an open one would keep it from being dropped)."""
    yield
    from scheduling.selectors import availability_watch_stop

    availability_watch_stop()


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Counts the availability answers computed from the database (the rest came from the cache)."""
    from scheduling import selectors

    calls: list[dict[str, Any]] = []
    original = selectors.availability_compute

    def counting(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(selectors, "availability_compute", counting)
    return calls
