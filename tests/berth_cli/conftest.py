"""The CLI against a live test server (pytest-django's ``live_server``, real PostgreSQL).

Commands run in-process through click's ``CliRunner`` and talk real HTTP to the live server;
one test runs the real ``python -m berth_cli`` process.  The config directory is a temporary
``XDG_CONFIG_HOME``; the display zone is Europe/Berlin so offsets are asserted, not assumed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from berth_cli.main import cli
from portal.accounts.models import Membership, Project
from scheduling.models import Cluster
from tests.factories import MembershipFactory, ProjectFactory
from tests.integration import loop

engine_redis_url = loop.engine_redis_url

Berth = Callable[..., Result]


@pytest.fixture
def server(live_server: Any, engine_redis_url: str) -> str:
    """The live server's URL (engine triggers are no-ops: the tests run rounds themselves)."""
    return str(live_server).rstrip("/")


@pytest.fixture
def sim_cluster() -> Cluster:
    """A simulator cluster of two 4-GPU A100 nodes."""
    return loop.make_cluster(nodes=2, gpus_per_node=4)


@pytest.fixture
def project() -> Project:
    return ProjectFactory(name="Vision", slug="vision")


@pytest.fixture
def member(project: Project) -> User:
    return MembershipFactory(project=project, role=Membership.Role.MEMBER, user__username="ada").user


@pytest.fixture
def manager(project: Project) -> User:
    return MembershipFactory(project=project, role=Membership.Role.MANAGER, user__username="grace").user


def make_berth(url: str, config_home: Path, token: str | None) -> Berth:
    def run(*args: str, env: dict[str, str | None] | None = None, stdin: str | None = None) -> Result:
        base: dict[str, str | None] = {
            "XDG_CONFIG_HOME": str(config_home),
            "BERTH_URL": url,
            "BERTH_TOKEN": token,
            "TZ": "Europe/Berlin",
        }
        runner = CliRunner()
        return runner.invoke(
            cli, list(args), env={**base, **(env or {})}, input=stdin, catch_exceptions=False
        )

    return run


@pytest.fixture
def berth(server: str, member: User, tmp_path: Path) -> Berth:
    """``berth`` as the project member ada, signed in with her API token."""
    token, _ = Token.objects.get_or_create(user=member)
    return make_berth(server, tmp_path / "config", token.key)


@pytest.fixture
def berth_as(server: str, tmp_path: Path) -> Callable[[User], Berth]:
    def for_user(user: User) -> Berth:
        token, _ = Token.objects.get_or_create(user=user)
        return make_berth(server, tmp_path / f"config-{user.pk}", token.key)

    return for_user
