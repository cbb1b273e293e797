"""`KubernetesBackend.job_output`: a job's pod log tail and exit code, from recorded API responses.

No kube-apiserver runs here (machine-setup.md §7) and the kmock emulator serves no ``pods/{name}/log``
subresource, so a tiny HTTP server on 127.0.0.1 answers the two calls the backend makes with
responses in the shape kube-apiserver v1.30 returns: the ``PodList`` of the job (the failed pod of
``k8s_data/pods.json``, with the terminated container status a real kubelet reports, and an older
attempt's pod) and the log as ``text/plain``, honouring ``tailLines`` as the server does.  They are
written by hand, not recorded from a live cluster; the real ``kubernetes`` client parses them.
"""

from __future__ import annotations

import copy
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduling.backends.base import BackendError
from scheduling.backends.k8s import KubernetesBackend, KubernetesConfig

pytestmark = pytest.mark.timeout(60)

DATA = Path(__file__).parent / "k8s_data"
LOG = "".join(f"epoch {i} loss {1.0 / (i + 1):.3f}\n" for i in range(300)) + "Traceback: CUDA out of memory\n"


def _pods() -> list[dict[str, Any]]:
    items = json.loads((DATA / "pods.json").read_text())["items"]
    failed = copy.deepcopy(next(p for p in items if p["metadata"]["name"] == "berth-fail-1-z8r5t"))
    failed["metadata"]["creationTimestamp"] = "2026-11-30T07:00:00Z"
    failed["status"]["containerStatuses"] = [
        {
            "name": "main",
            "ready": False,
            "restartCount": 0,
            "image": "ghcr.io/lab/train:1.4",
            "imageID": "ghcr.io/lab/train@sha256:0f3c",
            "state": {
                "terminated": {
                    "exitCode": 3,
                    "reason": "Error",
                    "startedAt": "2026-11-30T07:00:05Z",
                    "finishedAt": "2026-11-30T07:40:00Z",
                }
            },
        }
    ]
    older = copy.deepcopy(failed)
    older["metadata"]["name"] = "berth-fail-1-aaaaa"
    older["metadata"]["uid"] = "b1000000-0000-4000-8000-0000000000aa"
    older["metadata"]["creationTimestamp"] = "2026-11-30T06:00:00Z"
    return [older, failed]


class _Api(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, str]]] = []
    log_status = 200

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        self.seen.append((url.path, query))
        if url.path == "/api/v1/namespaces/research/pods":
            self._send(
                200,
                "application/json",
                json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": _pods()}),
            )
        elif url.path.startswith("/api/v1/namespaces/research/pods/") and url.path.endswith("/log"):
            if self.log_status != 200:
                status = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": "container main in pod x is waiting to start",
                    "reason": "BadRequest",
                    "code": self.log_status,
                }
                self._send(self.log_status, "application/json", json.dumps(status))
                return
            lines = LOG.splitlines(keepends=True)
            tail = int(query.get("tailLines", len(lines)))
            self._send(200, "text/plain", "".join(lines[-tail:]))
        else:
            self._send(
                404, "application/json", json.dumps({"kind": "Status", "code": 404, "message": "nope"})
            )

    def _send(self, code: int, kind: str, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[tuple[str, type[_Api]]]:
    handler = type("Handler", (_Api,), {"seen": [], "log_status": 200})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_job_output_reads_the_newest_pods_log_tail_and_exit_code(api: tuple[str, type[_Api]]) -> None:
    url, handler = api
    backend = KubernetesBackend(KubernetesConfig(host=url, namespace="research", timeout_s=5.0))

    out = backend.job_output("fail-1", tail_lines=20)

    assert out.exit_code == 3
    assert out.source == "pod research/berth-fail-1-z8r5t"  # the newer attempt, not berth-fail-1-aaaaa
    lines = out.stdout.splitlines()
    assert len(lines) == 20
    assert lines[-1] == "Traceback: CUDA out of memory"
    assert lines[0] == "epoch 281 loss 0.004"
    assert out.is_truncated is True
    assert out.stderr == ""  # Kubernetes merges the streams
    pods_call, log_call = handler.seen
    assert pods_call[1]["labelSelector"] == "berth.dev/job-id=fail-1"
    assert log_call[0] == "/api/v1/namespaces/research/pods/berth-fail-1-z8r5t/log"
    assert log_call[1]["tailLines"] == "21"  # one more than shown: tells whether older lines exist

    whole = backend.job_output("fail-1", tail_lines=1000)
    assert whole.is_truncated is False
    assert whole.stdout == LOG


def test_a_pod_whose_container_never_started_gives_empty_output_and_the_reason(
    api: tuple[str, type[_Api]],
) -> None:
    url, handler = api
    handler.log_status = 400
    out = KubernetesBackend(KubernetesConfig(host=url, namespace="research", timeout_s=5.0)).job_output(
        "fail-1"
    )
    assert out.stdout == ""
    assert out.exit_code == 3
    assert "waiting to start" in out.source


def test_no_pod_and_an_unreachable_api(api: tuple[str, type[_Api]]) -> None:
    url, _ = api
    out = KubernetesBackend(KubernetesConfig(host=url, namespace="research", timeout_s=5.0)).job_output(
        "other-7"
    )
    assert out.stdout == ""
    assert out.source == "no pod of Job berth-other-7 in research"
    dead = KubernetesBackend(KubernetesConfig(host="http://127.0.0.1:9", namespace="research", timeout_s=2.0))
    with pytest.raises(BackendError):
        dead.job_output("fail-1")
