"""The live simulator's settings: switches read as the words say (pure, no Redis or database)."""

from __future__ import annotations

import pytest

from scheduling.backends.live_sim import LiveSimConfig


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), (1, True), (0, False), ("true", True), ("false", False), ("No", False)],
)
def test_a_switch_reads_as_written(value: object, expected: bool) -> None:
    config = LiveSimConfig.from_mapping({"refuse_starts": value, "is_unreachable": value}, key_prefix="p")
    assert config.refuse_starts is expected
    assert config.is_unreachable is expected


@pytest.mark.parametrize("value", ["maybe", 2, 0.5, None, []])
def test_a_switch_that_is_not_a_yes_or_no_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="fail_apply must be true or false"):
        LiveSimConfig.from_mapping({"fail_apply": value}, key_prefix="p")
