"""Fixtures for the backend tests.

Slurm: `slurm_data` reads the recorded slurmrestd answers under ``data/`` (re-record them with
``data/record_slurm.py``).  Tests marked ``slurm`` need the project's single-host Slurm
(``scripts/slurm.sh start``, then ``export BERTH_SLURM=1``; ``make test`` does both) and are skipped
without it.  Every live test run uses its own job/reservation name prefix, so leftovers of an earlier run
never show up in its snapshots, and cancels what it made at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scheduling.backends.slurm import SlurmBackend, SlurmConfig

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[3]
SLURM_SH = ROOT / "scripts" / "slurm.sh"


@pytest.fixture
def slurm_data() -> Callable[[str], str]:
    """Text of one recorded slurmrestd answer, by file name."""

    def read(name: str) -> str:
        return (DATA / name).read_text()

    return read


@pytest.fixture(scope="session")
def slurm_prefix() -> str:
    return f"berth-t{uuid.uuid4().hex[:6]}-"


@pytest.fixture(scope="session")
def slurm_config(slurm_prefix: str) -> Iterator[SlurmConfig]:
    """Config of the live Slurm, with this run's own name prefix; cleans up this run's jobs at the end."""
    if not os.environ.get("BERTH_SLURM"):
        pytest.skip("needs the local Slurm: run `scripts/slurm.sh start` and set BERTH_SLURM=1")
    base = SlurmConfig.from_env()
    config = SlurmConfig(
        url=base.url,
        user=base.user,
        token=base.token,
        partition=base.partition,
        job_name_prefix=slurm_prefix,
        reservation_prefix=slurm_prefix,
        timeout_s=20.0,
    )
    yield config
    # Cleanup is best effort and bounded: the controller may have been stopped by a failing test.
    subprocess.run([str(SLURM_SH), "start-controller"], capture_output=True, timeout=30, check=False)
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    ids = [
        line.split()[0]
        for line in out.splitlines()
        if line.split()[1:2] and line.split()[1].startswith(slurm_prefix)
    ]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30, check=False)
    out = subprocess.run(
        ["scontrol", "-o", "show", "reservation"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    for line in out.splitlines():
        name = line.split()[0].removeprefix("ReservationName=") if line.strip() else ""
        if name.startswith(slurm_prefix):
            subprocess.run(
                ["scontrol", "delete", f"ReservationName={name}"],
                capture_output=True,
                timeout=30,
                check=False,
            )


@pytest.fixture
def slurm_backend(slurm_config: SlurmConfig) -> SlurmBackend:
    return SlurmBackend(slurm_config)


@pytest.fixture
def job_dir() -> Iterator[Path]:
    """A directory Slurm jobs (running as the unprivileged job user) can write their evidence into."""
    path = Path(tempfile.mkdtemp(prefix="berth-slurm-test-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
