"""Every backend implements the whole `ClusterBackend` protocol, and callers do not probe for parts of it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from scheduling.backends.base import ClusterBackend
from scheduling.backends.k8s import KubernetesBackend
from scheduling.backends.live_sim import LiveSimBackend
from scheduling.backends.simulator import SimulatorBackend
from scheduling.backends.slurm import SlurmBackend

ROOT = Path(__file__).resolve().parents[3]
BACKENDS = [SimulatorBackend, LiveSimBackend, SlurmBackend, KubernetesBackend]
MEMBERS = ["snapshot", "apply", "cancel", "job_output"]


def _protocol_parameters(name: str) -> list[inspect.Parameter]:
    return list(inspect.signature(getattr(ClusterBackend, name)).parameters.values())[1:]


def test_the_protocol_declares_what_the_round_and_the_portal_call() -> None:
    declared = {name for name in vars(ClusterBackend) if not name.startswith("_")}
    assert set(MEMBERS) <= declared
    assert "payloads" in inspect.signature(ClusterBackend.apply).parameters


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("member", MEMBERS)
def test_every_backend_accepts_every_call_the_protocol_allows(backend: type, member: str) -> None:
    parameters = inspect.signature(getattr(backend, member)).parameters
    for expected in _protocol_parameters(member):
        assert expected.name in parameters, f"{backend.__name__}.{member} lacks {expected.name}"
        actual = parameters[expected.name]
        assert actual.kind == expected.kind, f"{backend.__name__}.{member}({expected.name}) kind"
        assert actual.default == expected.default, f"{backend.__name__}.{member}({expected.name}) default"
    extra = [
        p
        for p in parameters.values()
        if p.name != "self" and p.name not in dict.fromkeys(q.name for q in _protocol_parameters(member))
    ]
    assert all(p.default is not inspect.Parameter.empty for p in extra), "extra parameters need defaults"


_PROBE = re.compile(r"getattr\(\s*(self\.)?_?backend|hasattr\(\s*(self\.)?_?backend|inspect\.signature")


def test_no_caller_probes_a_backend_for_a_method() -> None:
    callers = [*ROOT.glob("scheduling/rounds/**/*.py"), *ROOT.glob("scheduling/services/**/*.py")]
    callers += [ROOT / "scheduling" / name for name in ("selectors.py", "tasks.py", "snapshots.py")]
    probing = [str(path.relative_to(ROOT)) for path in callers if _PROBE.search(path.read_text())]
    assert probing == []
