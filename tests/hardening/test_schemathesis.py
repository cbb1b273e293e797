"""Fuzz the whole REST API from its OpenAPI schema, in-process (WSGI), as a researcher and as staff.

Every generated request must get a documented status code, a body matching the schema and never
a 5xx.  ``BERTH_FUZZ_EXAMPLES`` sets the examples per operation (CI: a few; ``make fuzz``: more).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token
from schemathesis.specs.openapi import checks as openapi_checks

from portal.accounts.models import Membership
from portal.wsgi import application
from scheduling import services
from tests.factories import (
    ClusterFactory,
    GpuTypeFactory,
    MembershipFactory,
    NodeFactory,
    ProjectFactory,
    UserFactory,
)

EXAMPLES = int(os.environ.get("BERTH_FUZZ_EXAMPLES", "10"))
CHECKS = [
    schemathesis.checks.not_a_server_error,
    openapi_checks.status_code_conformance,
    openapi_checks.content_type_conformance,
    openapi_checks.response_schema_conformance,
]


@pytest.fixture
def wsgi_in_test_transaction():
    """Keep the test's connection open across WSGI requests, as Django's test client does.

    The raw WSGI handler closes "old" connections at each request's start and end, which would
    close the connection holding the test's transaction.
    """
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def fuzz_data(db, wsgi_in_test_transaction):
    """A small lab: a cluster with A100s, two projects, a booking and a job, tokens per role."""
    a100 = GpuTypeFactory(name="A100")
    cluster = ClusterFactory(name="alpha")
    NodeFactory(cluster=cluster, gpu_type=a100, name="a0", gpu_count=4)
    project = ProjectFactory(name="Vision", slug="vision")
    researcher = MembershipFactory(project=project, role=Membership.Role.MEMBER).user
    staff = UserFactory(is_staff=True, is_superuser=True)
    MembershipFactory(project=project, user=staff, role=Membership.Role.MANAGER)
    start = (timezone.now() + timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    services.booking_create(
        user=researcher,
        project=project,
        gpu_type=a100,
        gpu_count=1,
        start_at=start,
        end_at=start + timedelta(hours=1),
    )
    return {
        "researcher": (researcher, Token.objects.get_or_create(user=researcher)[0].key),
        "staff": (staff, Token.objects.get_or_create(user=staff)[0].key),
    }


# Loaded at collection (pytest-django has configured Django by then); generating the schema
# needs no database.  (schemathesis.pytest.from_fixture does not run on pytest 9 yet.)
schema = schemathesis.openapi.from_wsgi("/api/schema/", application)


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_schema(case, fuzz_data):
    # Each generated request is sent once per role: the same input, two permission paths.
    for user, key in fuzz_data.values():
        case.call_and_validate(headers={"Authorization": f"Token {key}"}, checks=CHECKS)
        # DELETE /api/v1/me/token/ revokes the key: restore it, or every later example is a 401.
        Token.objects.get_or_create(user=user, defaults={"key": key})
