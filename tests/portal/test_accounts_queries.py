"""portal/accounts/queries.py against the ORM: the rate counter's upsert."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.accounts.models import RateCounter
from portal.accounts.queries import rate_counter_hit

pytestmark = pytest.mark.django_db


def _orm(key: str) -> tuple[int, float]:
    row = RateCounter.objects.get(key=key)
    return row.count, (row.expires_at - timezone.now()).total_seconds()


def test_hits_count_up_in_the_window_and_push_the_expiry_out() -> None:
    assert [rate_counter_hit("login:ada", window_s=60) for _ in range(3)] == [1, 2, 3]
    count, left_s = _orm("login:ada")
    assert count == 3
    assert 50 < left_s <= 60
    assert rate_counter_hit("login:ada", window_s=600) == 4
    assert 590 < _orm("login:ada")[1] <= 600  # every hit sets the expiry from now


def test_an_expired_key_starts_again_at_one_and_a_new_window_sweeps_expired_rows() -> None:
    past = timezone.now() - timedelta(seconds=5)
    RateCounter.objects.create(key="login:bob", count=9, expires_at=past)
    RateCounter.objects.create(key="login:old", count=4, expires_at=past)
    RateCounter.objects.create(key="login:live", count=2, expires_at=timezone.now() + timedelta(hours=1))
    assert rate_counter_hit("login:bob", window_s=60) == 1
    assert _orm("login:bob")[0] == 1
    assert sorted(RateCounter.objects.values_list("key", flat=True)) == ["login:bob", "login:live"]
    assert rate_counter_hit("login:live", window_s=60) == 3  # not a new window: nothing swept


def test_keys_are_cut_to_the_columns_length() -> None:
    key = "x" * 500
    assert rate_counter_hit(key, window_s=60) == 1
    assert rate_counter_hit(key[:200] + "different tail", window_s=60) == 2
    assert RateCounter.objects.get().key == key[:200]
