"""`rounds.batch.array_literal`: what PostgreSQL reads back from the literal is the values given,
sent through Django's cursor (quoted into the statement) and through `queries.binary.bound_cursor`
(a parameter apart from it, as the round's writes send it)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection

from scheduling.models import Job
from scheduling.queries.binary import bound_cursor
from scheduling.rounds.batch import array_literal

pytestmark = pytest.mark.django_db

_VIA = {"django": connection.cursor, "bound": bound_cursor}


@pytest.fixture(params=sorted(_VIA))
def via(request):
    return request.param


def _read_back(values, kind, via="django"):
    with _VIA[via]() as cursor:
        cursor.execute(
            f"SELECT v FROM UNNEST(%s::{kind}[]) WITH ORDINALITY AS t(v, i) ORDER BY i",  # noqa: S608 (a type name)
            [array_literal(values)],
        )
        return [row[0] for row in cursor.fetchall()]


def test_text_comes_back_as_given(via):
    texts = [
        "",
        "NULL",
        "null",
        " leading and trailing ",
        'a "quoted" word',
        "back\\slash \\\\ twice \\",
        "{braces},commas,",
        "new\nline\ttab",
        "ünïcödé ✓ 日本",
        "'single' quotes",
        None,
        "Expected start in 5.4 d (p90 10.6 d).",
        Job.Status.PENDING,  # a Choices member: its value
    ]
    assert _read_back(texts, "varchar", via) == [t if t is None else str(t) for t in texts]
    assert _read_back(texts, "text", via)[-1] == "pending"


def test_numbers_and_flags_come_back_exactly(via):
    floats = [
        0.0,
        -0.0,
        1.5,
        1 / 3,
        1e-300,
        5e-324,
        1.7976931348623157e308,
        1e16,
        -2.5e-7,
        math.inf,
        -math.inf,
        None,
    ]
    back = _read_back(floats, "float8", via)
    assert back[:-1] == floats[:-1]
    assert math.copysign(1.0, back[1]) == -1.0
    assert back[-1] is None
    assert math.isnan(_read_back([math.nan], "float8", via)[0])
    ints = [0, -1, 2**62, None, 7]
    assert _read_back(ints, "bigint", via) == ints
    assert _read_back([True, False, None], "boolean", via) == [True, False, None]


def test_instants_come_back_exactly(via):
    instants = [
        datetime(2026, 12, 3, 10, 0, 0, 123456, tzinfo=UTC),
        datetime(2026, 12, 3, 10, 0, 0, 1, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        None,
    ]
    assert _read_back(instants, "timestamptz", via) == instants
