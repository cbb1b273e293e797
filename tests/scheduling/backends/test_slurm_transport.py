"""The Slurm backend's HTTP and token handling, without Slurm.

A real HTTP server on 127.0.0.1 stands in for slurmrestd and answers with the recorded v0.0.38 responses
(``data/``).  ``scontrol token`` is replaced by a function that hands out numbered tokens: this suite
runs where Slurm does not (the live suite, ``test_slurm_live.py``, uses the real ``scontrol``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scheduling.backends.base import BackendError
from scheduling.backends.slurm import SlurmBackend, SlurmConfig
from scheduling.engine.types import Plan, PreemptAction, StartAction


@dataclass
class FakeRestd:
    """What the stand-in answers and what it was asked."""

    answers: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    unauthorized_first: int = 0  # answer this many requests with 401 first
    seen: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, token)
    url: str = ""


@pytest.fixture
def restd(slurm_data: Callable[[str], str]) -> Iterator[FakeRestd]:
    fake = FakeRestd(
        answers={
            ("GET", "/slurm/v0.0.38/nodes"): (200, slurm_data("slurm_nodes.json")),
            ("GET", "/slurm/v0.0.38/jobs"): (200, slurm_data("slurm_jobs.json")),
            ("GET", "/slurm/v0.0.38/reservations"): (200, '{"errors": [], "reservations": []}'),
        }
    )

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            path = self.path.split("?", 1)[0]
            fake.seen.append((self.command, path, self.headers.get("X-SLURM-USER-TOKEN", "")))
            if fake.unauthorized_first > 0:
                fake.unauthorized_first -= 1
                status, body = 401, "Authentication failure"
            else:
                status, body = fake.answers.get((self.command, path), (404, '{"errors": [{"error": "no"}]}'))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()


def numbered_tokens(minted: list[Sequence[str]]) -> Callable[[Sequence[str]], str]:
    def run(argv: Sequence[str]) -> str:
        minted.append(list(argv))
        return f"SLURM_JWT=token{len(minted)}\n"

    return run


def test_401_mints_a_new_token_and_retries_once(restd: FakeRestd) -> None:
    minted: list[Sequence[str]] = []
    backend = SlurmBackend(SlurmConfig(url=restd.url, user="svc"), runner=numbered_tokens(minted))
    restd.unauthorized_first = 1
    snap = backend.snapshot()
    assert len(snap.nodes) == 4
    assert minted[0] == ["scontrol", "token", "username=svc", "lifespan=3600"]
    assert [s[2] for s in restd.seen] == ["token1", "token2", "token2"]  # nodes 401, nodes again, jobs


def test_fixed_token_is_never_minted_and_a_401_is_an_error(restd: FakeRestd) -> None:
    minted: list[Sequence[str]] = []
    backend = SlurmBackend(SlurmConfig(url=restd.url, token="fixed"), runner=numbered_tokens(minted))
    backend.snapshot()
    assert minted == []
    assert {s[2] for s in restd.seen} == {"fixed"}
    restd.unauthorized_first = 2
    with pytest.raises(BackendError, match="401"):
        backend.snapshot()


def test_token_renewed_before_expiry(restd: FakeRestd) -> None:
    minted: list[Sequence[str]] = []
    now = [1_000.0]
    config = SlurmConfig(url=restd.url, token_lifespan_s=600, token_refresh_margin_s=60)
    backend = SlurmBackend(config, runner=numbered_tokens(minted), clock=lambda: now[0])
    backend.snapshot()
    now[0] += 539  # 1 s before the refresh point
    backend.snapshot()
    assert len(minted) == 1
    now[0] += 2
    backend.snapshot()
    assert len(minted) == 2
    assert restd.seen[-1][2] == "token2"


def test_controller_down_answer_raises(restd: FakeRestd, slurm_data: Callable[[str], str]) -> None:
    restd.answers[("GET", "/slurm/v0.0.38/jobs")] = (500, slurm_data("slurm_jobs_controller_down.json"))
    backend = SlurmBackend(SlurmConfig(url=restd.url, token="t"))
    with pytest.raises(BackendError, match="Failed while looking for jobs"):
        backend.snapshot()


def test_nothing_listening_raises() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = SlurmBackend(SlurmConfig(url=f"http://127.0.0.1:{port}", token="t", timeout_s=2))
    with pytest.raises(BackendError, match="unreachable"):
        backend.snapshot()


def test_dry_run_sends_only_reads(restd: FakeRestd) -> None:
    backend = SlurmBackend(SlurmConfig(url=restd.url, token="t", dry_run=True), clock=lambda: 2e9)
    plan = Plan(
        starts=(StartAction("new", (0, 1), ("n1",), is_preemptible=False, expected_end_at=2e9 + 60),),
        # run1 is RUNNING in the recording; signal and kill time have both passed.
        preemptions=(PreemptAction("run1", 1e9, 1e9, "test"),),
    )
    results = backend.apply(plan, payloads={"new": {"command": "true"}})
    assert [r.is_ok for r in results] == [True, True]
    assert all("dry-run" in r.message for r in results)
    assert {method for method, _, _ in restd.seen} == {"GET"}


def test_submit_refusal_is_a_failed_result(restd: FakeRestd, slurm_data: Callable[[str], str]) -> None:
    restd.answers[("POST", "/slurm/v0.0.38/job/submit")] = (500, slurm_data("slurm_submit_rejected.json"))
    backend = SlurmBackend(SlurmConfig(url=restd.url, token="t"))
    [result] = backend.apply(
        Plan(starts=(StartAction("new", (0,), ("n1",), is_preemptible=False, expected_end_at=0.0),)),
        payloads={"new": {"command": "true"}},
    )
    assert not result.is_ok
    assert "Failure during parsing" in result.message


@pytest.mark.parametrize(
    ("gpu_ids", "node_ids", "expected"),
    [
        ((0, 1), ("n2",), "not on the planned nodes"),  # 0 and 1 are n1's
        ((0, 1, 8), ("n1", "n3"), "same GPU count"),  # Slurm's gres is per node
        ((999,), ("n1",), "on no Slurm node"),
    ],
)
def test_plans_slurm_cannot_express_are_failed_results(
    restd: FakeRestd, gpu_ids: tuple[int, ...], node_ids: tuple[str, ...], expected: str
) -> None:
    backend = SlurmBackend(SlurmConfig(url=restd.url, token="t"))
    action = StartAction("new", gpu_ids, node_ids, is_preemptible=False, expected_end_at=0.0)
    [result] = backend.apply(Plan(starts=(action,)), payloads={"new": {"command": "true"}})
    assert not result.is_ok
    assert expected in result.message
    assert {method for method, _, _ in restd.seen} == {"GET"}  # nothing was submitted
