"""Cluster settings per backend kind (scheduling.backends.settings): pure, no database."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scheduling.backends.live_sim import LiveSimConfig
from scheduling.backends.settings import cluster_settings, unknown_keys


def test_only_the_given_keys_come_back_validated() -> None:
    assert cluster_settings("slurm", {"url": "http://127.0.0.1:6820", "dry_run": True, "policy": "fifo"}) == {
        "url": "http://127.0.0.1:6820",
        "dry_run": True,
    }
    assert cluster_settings("kubernetes", {}) == {}
    assert cluster_settings("slurm", {"default_time_limit_s": 3600.0}) == {"default_time_limit_s": 3600}


@pytest.mark.parametrize("kind", ["slurm", "kubernetes"])
@pytest.mark.parametrize(("value", "expected"), [("false", False), ("TRUE", True), (0, False), (True, True)])
def test_a_switch_reads_as_written_for_every_kind(kind: str, value: object, expected: bool) -> None:
    assert cluster_settings(kind, {"dry_run": value}) == {"dry_run": expected}


@pytest.mark.parametrize(
    ("kind", "raw", "message"),
    [
        ("slurm", {"dry_run": "maybe"}, "dry_run must be true or false, not 'maybe'"),
        ("slurm", {"timeout_s": "soon"}, "timeout_s must be a number, not 'soon'"),
        ("slurm", {"timeout_s": True}, "timeout_s must be a number"),
        ("slurm", {"timeout_s": -1}, "timeout_s: Input should be greater than 0"),
        ("slurm", {"default_time_limit_s": 0}, "default_time_limit_s: Input should be greater than 0"),
        ("slurm", {"url": "http://127.0.0.1:-1"}, "url has no valid port"),
        ("slurm", {"url": "http://127.0.0.1:70000"}, "url has no valid port"),
        ("slurm", {"url": "ftp://host"}, "url must be an http(s) URL"),
        ("slurm", {"partition": ""}, "partition: String should have at least 1 character"),
        ("slurm", {"user": 7}, "user: Input should be a valid string"),
        ("kubernetes", {"host": "localhost"}, "host must be an http(s) URL"),
        ("kubernetes", {"namespace": "Lab_1"}, "namespace: String should match pattern"),
        ("kubernetes", {"gpu_types": {"A100": 1}}, "gpu_types: Input should be a valid string"),
        ("kubernetes", {"gpu_types": ["A100"]}, "gpu_types: Input should be a valid dictionary"),
        (
            "kubernetes",
            {"termination_grace_s": -5},
            "termination_grace_s: Input should be greater than or equal",
        ),
        ("simulator", {"fail_rate": 1.5}, "fail_rate: Input should be less than or equal to 1"),
        ("simulator", {"block_in": "elsewhere"}, "block_in: Input should be '', 'snapshot' or 'apply'"),
        ("simulator", {"speedup": "fast"}, "speedup: Input should be a valid number"),
        (
            "simulator",
            {"runtime_fraction_lo": 0.9, "runtime_fraction_hi": 0.3},
            "need 0 < runtime_fraction_lo",
        ),
    ],
)
def test_a_bad_value_is_refused_with_its_key(kind: str, raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        cluster_settings(kind, raw)


def test_every_bad_key_is_named_at_once() -> None:
    with pytest.raises(ValueError, match="timeout_s") as info:
        cluster_settings("slurm", {"timeout_s": -1, "dry_run": "maybe"})
    assert "dry_run must be true or false" in str(info.value)


def test_unknown_keys_are_ignored_and_named_apart_from_the_shared_policy() -> None:
    raw = {"policy": {"name": "fifo"}, "partiton": "gpu", "speedup": 2}
    assert cluster_settings("slurm", raw) == {}
    assert unknown_keys("slurm", raw) == ["partiton", "speedup"]
    assert unknown_keys("simulator", raw) == ["partiton"]
    assert unknown_keys("simulator", {"inventory": "lab.csv", "scale": 0.1}) == []


def test_the_simulator_config_takes_numeric_strings_as_before() -> None:
    config = LiveSimConfig.from_mapping({"speedup": "4", "seed": "3", "refuse_starts": "no"}, key_prefix="p")
    assert (config.speedup, config.seed, config.refuse_starts) == (4.0, 3, False)
