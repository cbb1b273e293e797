"""Fixtures of the portal tests."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client


@pytest.fixture
def staff_web(client: Client, staff: User) -> Client:
    """The test client signed in as a staff (operations) user."""
    client.force_login(staff)
    return client
