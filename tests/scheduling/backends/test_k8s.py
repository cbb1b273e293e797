"""KubernetesBackend against an emulated Kubernetes API.

No kube-apiserver can run on this machine (no Docker, no binaries; machine-setup.md §7), so:

- Stateful behaviour (create, read back, list, delete, conflicts) runs against the ``kmock`` emulator: an
  in-memory, Kubernetes-shaped HTTP API on 127.0.0.1, driven by the real ``kubernetes`` client.  It stores
  objects as plain JSON; it runs no controllers (a created Job never gets pods), ignores label selectors and
  does not serve cluster-scoped nodes on its own, so the tests seed nodes, Jobs and pods into it.  The seeds
  are the JSON documents in ``k8s_data/``: written by hand in the shape the Kubernetes API returns (v1.30
  field names and values), not recorded from a real cluster, since none is reachable from here.
- Failures the emulator cannot produce on demand (500, 403, 422) come from a tiny HTTP handler on
  127.0.0.1 that answers every request with a Kubernetes ``Status`` document; a refused connection uses a
  port nothing listens on.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import http.server
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import kmock
import pytest
from kubernetes import client as k8s_client

from scheduling.backends.base import BackendError, ClusterBackend, ObservedState
from scheduling.backends.k8s import (
    GPU_IDS_ANNOTATION,
    JOB_ID_LABEL,
    STOP_REASON_ANNOTATION,
    JobPayload,
    KubernetesBackend,
    KubernetesConfig,
    PayloadSource,
    PriorityClasses,
    job_label_value,
    job_name,
)
from scheduling.engine import plan_round
from scheduling.engine.types import (
    ClusterSnapshot,
    GpuType,
    JobKind,
    JobRequest,
    NodeStatus,
    Plan,
    PolicyConfig,
    PreemptAction,
    ReleaseAction,
    ReserveAction,
    StartAction,
)

pytestmark = pytest.mark.timeout(60)

DATA = Path(__file__).parent / "k8s_data"
NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")
JOBS = kmock.resource("batch", "v1", "jobs")
GPU_TYPES = {"NVIDIA-A100-SXM4-80GB": "A100", "NVIDIA-H100-80GB-HBM3": "H100"}
PAYLOAD = JobPayload(
    image="ghcr.io/lab/train:1.4",
    command=("python", "-m", "train"),
    args=("--epochs", "3"),
    env={"WANDB_MODE": "offline"},
    requests={"cpu": "8", "memory": "64Gi"},
    labels={"berth.dev/project": "vision"},
)

_T = TypeVar("_T")


def _load(name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads((DATA / name).read_text())["items"]
    return items


class Emulator:
    """A kmock `KubernetesEmulator` served on 127.0.0.1 by an event loop in a background thread.

    Every touch of the emulator's state goes through that loop, so the test thread never races it.
    """

    def __init__(self) -> None:
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._k8s: kmock.KubernetesEmulator | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the kmock emulator did not start within 10 s")

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as k8s, kmock.Server(k8s, host="127.0.0.1") as server:
            # The emulator knows a resource only once an object of it exists; declare the two the backend
            # lists, so that an empty namespace answers an empty list (as a real server does) and not 404.
            k8s.resources[PODS] = kmock.ResourceInfo(namespaced=True, kind="Pod")
            k8s.resources[JOBS] = kmock.ResourceInfo(namespaced=True, kind="Job")
            self._k8s = k8s
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def _in_loop(self, fn: Callable[[kmock.KubernetesEmulator], _T]) -> _T:
        async def call() -> _T:
            assert self._k8s is not None
            return fn(self._k8s)

        coro: Coroutine[Any, Any, _T] = call()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def put(self, resource: kmock.resource, namespace: str | None, obj: dict[str, Any]) -> None:
        def put(k8s: kmock.KubernetesEmulator) -> None:
            k8s.objects[resource, namespace, obj["metadata"]["name"]] = copy.deepcopy(obj)

        self._in_loop(put)

    def replace_nodes(self, nodes: list[dict[str, Any]]) -> None:
        def swap(k8s: kmock.KubernetesEmulator) -> None:
            for key in [key for key in k8s.objects if key[0] == NODES]:
                del k8s.objects[key]
            for node in nodes:
                k8s.objects[NODES, None, node["metadata"]["name"]] = copy.deepcopy(node)

        self._in_loop(swap)

    def exists(self, resource: kmock.resource, namespace: str, name: str) -> bool:
        def check(k8s: kmock.KubernetesEmulator) -> bool:
            key = (resource, namespace, name)
            return key in k8s.objects and not k8s.objects[key].deleted

        return self._in_loop(check)

    def request_count(self) -> int:
        return self._in_loop(lambda k8s: len(list(k8s)))

    def requests_since(self, mark: int) -> list[kmock.Request]:
        return self._in_loop(lambda k8s: list(k8s)[mark:])


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    emu = Emulator()
    emu.start()
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace of its own per test: the module-scoped emulator keeps objects between tests."""
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:10]
    return f"t-{request.node.originalname.replace('_', '-')[:40]}-{digest}"


@pytest.fixture
def nodes(emulator: Emulator) -> list[dict[str, Any]]:
    items = _load("nodes.json")
    emulator.replace_nodes(items)
    return items


def _backend(
    emulator: Emulator, namespace: str, *, payload_source: PayloadSource | None = None, **overrides: Any
) -> KubernetesBackend:
    config = KubernetesConfig(host=emulator.url, namespace=namespace, gpu_types=GPU_TYPES, timeout_s=5.0)
    return KubernetesBackend(
        replace(config, **overrides), payload_source=payload_source, clock=lambda: 1_000.0
    )


def _api(emulator: Emulator) -> k8s_client.ApiClient:
    configuration = k8s_client.Configuration()
    configuration.host = emulator.url
    return k8s_client.ApiClient(configuration)


def _read_job(emulator: Emulator, namespace: str, name: str) -> k8s_client.V1Job:
    return k8s_client.BatchV1Api(_api(emulator)).read_namespaced_job(name, namespace)


def _start(job_id: str, gpu_ids: tuple[int, ...], nodes: tuple[str, ...], **kw: Any) -> StartAction:
    return StartAction(
        job_id=job_id,
        gpu_ids=gpu_ids,
        node_ids=nodes,
        is_preemptible=kw.get("is_preemptible", False),
        expected_end_at=5_000.0,
    )


def _pod_of(job_id: str, *, suffix: str = "x1", node: str = "gpu-a", gpu_ids: str = "0") -> dict[str, Any]:
    """A running pod as the Job controller would create it (the emulator runs no controllers)."""
    name = job_name(job_id)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{suffix}",
            "labels": {JOB_ID_LABEL: job_label_value(job_id), "batch.kubernetes.io/job-name": name},
            "annotations": {"berth.dev/job-id": job_id, GPU_IDS_ANNOTATION: gpu_ids},
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": PAYLOAD.image}]},
        "status": {"phase": "Running", "startTime": "2026-11-30T08:00:00Z"},
    }


# ---- snapshot ----


def test_backend_satisfies_protocol(emulator: Emulator) -> None:
    """Pure type check, no API call."""
    assert isinstance(_backend(emulator, "any"), ClusterBackend)


def test_snapshot_reads_nodes_gpu_capacity_types_and_states(
    emulator: Emulator, nodes: list[dict[str, Any]]
) -> None:
    """Nodes from k8s_data/nodes.json, seeded into the emulator (it serves no nodes of its own).

    The file holds one node per case: tolerated GPU taint, cordoned, unreachable, untolerated taint,
    NotReady without a product label, and a CPU-only node.
    """
    observed = _backend(emulator, "research").snapshot()

    gpu_nodes = sorted(  # the names in the file sort the same in natural and plain order
        (n for n in nodes if int(n["status"]["allocatable"].get("nvidia.com/gpu", "0")) > 0),
        key=lambda n: n["metadata"]["name"],
    )
    assert [n.id for n in observed.nodes] == [n["metadata"]["name"] for n in gpu_nodes]
    assert "cpu-1" not in {n.id for n in observed.nodes}

    # GPU ids: nodes sorted by name, GPUs numbered consecutively; the count is the allocatable count.
    expected_ids: list[tuple[int, ...]] = []
    next_id = 0
    for raw in gpu_nodes:
        count = int(raw["status"]["allocatable"]["nvidia.com/gpu"])
        expected_ids.append(tuple(range(next_id, next_id + count)))
        next_id += count
    assert [n.gpu_ids for n in observed.nodes] == expected_ids
    all_ids = [gpu for n in observed.nodes for gpu in n.gpu_ids]
    assert len(all_ids) == len(set(all_ids))

    by_name = {n.id: n for n in observed.nodes}
    assert by_name["gpu-a"].gpu_type == "A100"  # mapped product label
    assert by_name["gpu-b"].gpu_type == "H100"
    assert by_name["gpu-d"].gpu_type == "Tesla-V100-SXM2-32GB"  # unmapped: raw label value
    assert by_name["gpu-e"].gpu_type == "unknown"  # no product label
    assert by_name["gpu-a"].status is NodeStatus.UP  # its nvidia.com/gpu taint is tolerated
    assert by_name["gpu-b"].status is NodeStatus.DRAINING  # cordoned
    assert by_name["gpu-c"].status is NodeStatus.DOWN  # Ready=Unknown and unreachable taints
    assert by_name["gpu-d"].status is NodeStatus.DRAINING  # a NoSchedule taint Berth does not tolerate
    assert by_name["gpu-e"].status is NodeStatus.DOWN  # Ready=False
    assert observed.at == 1_000.0
    assert observed.jobs == ()


def test_snapshot_gpu_ids_and_domain_from_configuration(
    emulator: Emulator, nodes: list[dict[str, Any]]
) -> None:
    """Seeded nodes as above; a configured id mapping wins over the enumeration, a toleration un-drains."""
    mapping = {"gpu-a": (100, 101, 102, 103)}
    backend = _backend(
        emulator,
        "research",
        gpu_ids=mapping,
        domain_label="topology.kubernetes.io/zone",
        tolerations=("nvidia.com/gpu", "example.org/maintenance"),
    )
    by_name = {n.id: n for n in backend.snapshot().nodes}
    assert by_name["gpu-a"].gpu_ids == mapping["gpu-a"]
    # The other nodes are enumerated above the configured ids, never colliding with them.
    others = [gpu for name, node in by_name.items() if name != "gpu-a" for gpu in node.gpu_ids]
    assert min(others) > max(mapping["gpu-a"])
    assert len(others) == len(set(others))
    assert by_name["gpu-a"].domain == "rack-1"
    assert by_name["gpu-d"].status is NodeStatus.UP


def test_snapshot_numbers_nodes_in_natural_order(emulator: Emulator) -> None:
    """Two copies of a node from k8s_data/nodes.json, renamed and seeded into the emulator."""
    [template] = [n for n in _load("nodes.json") if n["metadata"]["name"] == "gpu-a"]
    renamed = []
    for name in ("node-10", "node-2"):
        node = copy.deepcopy(template)
        node["metadata"]["name"] = name
        renamed.append(node)
    emulator.replace_nodes(renamed)

    observed = _backend(emulator, "research").snapshot()

    count = int(template["status"]["allocatable"]["nvidia.com/gpu"])
    assert [(n.id, n.gpu_ids) for n in observed.nodes] == [
        ("node-2", tuple(range(count))),
        ("node-10", tuple(range(count, 2 * count))),
    ]


def test_snapshot_maps_jobs_and_pods_to_observed_states(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Jobs and pods from k8s_data/jobs.json and pods.json, seeded into the emulator.

    Seeded because the emulator runs no Job controller or kubelet, so it never produces pods or statuses.
    It also ignores label selectors, so the non-Berth Job and pod in the files check the backend's own
    filtering.
    """
    jobs, pods = _load("jobs.json"), _load("pods.json")
    for job in jobs:
        emulator.put(JOBS, namespace, job)
    for pod in pods:
        emulator.put(PODS, namespace, pod)

    observed = {job.job_id: job for job in _backend(emulator, namespace).snapshot().jobs}

    berth_ids = {
        o["metadata"]["annotations"]["berth.dev/job-id"]
        for o in jobs + pods
        if JOB_ID_LABEL in o["metadata"].get("labels", {})
    }
    assert set(observed) == berth_ids  # etl-nightly (no Berth label) is not reported
    expected_states = {
        "run-1": ObservedState.RUNNING,
        "pend-1": ObservedState.PENDING,
        "queued-1": ObservedState.PENDING,
        "done-1": ObservedState.COMPLETED,
        "fail-1": ObservedState.FAILED,
        "evicted-1": ObservedState.PREEMPTED,  # Kubernetes' scheduler preempted the pod
        "preempting-1": ObservedState.PREEMPTED,  # terminating with stop-reason "preempted"
        "lost-1": ObservedState.LOST,
    }
    assert {job_id: job.state for job_id, job in observed.items()} == expected_states

    # GPU ids are the planned ones from the annotation, also for the terminating pod (GPUs still busy).
    annotated = {
        o["metadata"]["annotations"]["berth.dev/job-id"]: o["metadata"]["annotations"][GPU_IDS_ANNOTATION]
        for o in jobs + pods
        if GPU_IDS_ANNOTATION in o["metadata"].get("annotations", {})
    }
    for job_id, job in observed.items():
        assert job.gpu_ids == tuple(int(g) for g in annotated[job_id].split(","))

    def epoch(text: str) -> float:
        return datetime.fromisoformat(text).timestamp()

    assert observed["run-1"].started_at == epoch("2026-11-30T08:00:05Z")  # the pod's start
    assert observed["queued-1"].started_at is None
    assert observed["done-1"].ended_at == epoch("2026-11-30T07:30:00Z")
    assert observed["preempting-1"].ended_at is None  # still in its grace period
    assert "ImagePullBackOff" in observed["pend-1"].message
    assert "BackoffLimitExceeded" in observed["fail-1"].message
    assert observed["run-1"].backend_ref == "berth-run-1"


def test_snapshot_of_a_requeued_job_ignores_pods_of_the_earlier_attempt(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Seeded (the emulator has no Job controller): the new attempt's Job with its pending pod, and the
    preempted attempt's pod, owned by the old Job's uid, still in its grace period."""
    job_id = "requeued-1"
    emulator.put(
        JOBS,
        namespace,
        {
            "metadata": {
                "name": job_name(job_id),
                "uid": "new-uid",
                "labels": {JOB_ID_LABEL: job_id},
                "annotations": {"berth.dev/job-id": job_id, GPU_IDS_ANNOTATION: "2,3"},
            },
            "spec": {"template": {"spec": {"containers": [{"name": "main", "image": PAYLOAD.image}]}}},
            "status": {},
        },
    )
    new_pod = _pod_of(job_id, suffix="new", gpu_ids="2,3")
    new_pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": job_name(job_id), "uid": "new-uid"}
    ]
    new_pod["status"] = {"phase": "Pending"}
    old_pod = _pod_of(job_id, suffix="old", gpu_ids="0,1")
    old_pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": job_name(job_id), "uid": "old-uid"}
    ]
    old_pod["metadata"]["deletionTimestamp"] = "2026-11-30T08:20:30Z"
    old_pod["metadata"]["annotations"][STOP_REASON_ANNOTATION] = "preempted"
    emulator.put(PODS, namespace, new_pod)
    emulator.put(PODS, namespace, old_pod)

    [job] = _backend(emulator, namespace).snapshot().jobs

    assert (job.state, job.gpu_ids, job.started_at) == (ObservedState.PENDING, (2, 3), None)
    assert "earlier attempt" in job.message


# ---- start ----


@pytest.mark.parametrize(
    ("kind", "is_preemptible", "priority_class", "kind_label"),
    [
        (JobKind.BATCH, False, "lab-batch", "batch"),
        (JobKind.INTERACTIVE, False, "lab-interactive", "interactive"),
        (JobKind.BATCH, True, "lab-scavenger", "preemptible"),
    ],
)
def test_start_creates_pinned_job_with_gpu_limits_priority_and_labels(
    emulator: Emulator,
    nodes: list[dict[str, Any]],
    namespace: str,
    kind: JobKind,
    is_preemptible: bool,
    priority_class: str,
    kind_label: str,
) -> None:
    """The Job is created in the emulator and read back through the API as a real client would."""
    classes = PriorityClasses(interactive="lab-interactive", batch="lab-batch", preemptible="lab-scavenger")
    backend = _backend(emulator, namespace, priority_classes=classes, termination_grace_s=120)
    backend.snapshot()  # learns the nodes' product labels, as every engine round does before apply
    action = _start("job-7", (1, 2), ("gpu-a",), is_preemptible=is_preemptible)

    results = backend.apply(Plan(starts=(action,)), payloads={"job-7": replace(PAYLOAD, kind=kind)})

    assert [(r.action, r.target_id, r.is_ok) for r in results] == [("start", "job-7", True)]
    job = _read_job(emulator, namespace, job_name("job-7"))
    assert job.spec is not None
    assert job.metadata is not None
    assert job.spec.backoff_limit == 0
    pod = job.spec.template.spec
    assert pod is not None
    container = pod.containers[0]
    assert container.image == PAYLOAD.image
    assert container.command == list(PAYLOAD.command)
    assert container.args == list(PAYLOAD.args)
    assert container.resources is not None
    assert container.resources.limits == {"nvidia.com/gpu": str(len(action.gpu_ids))}
    assert container.resources.requests == {**PAYLOAD.requests, "nvidia.com/gpu": str(len(action.gpu_ids))}
    assert pod.restart_policy == "Never"
    assert pod.priority_class_name == priority_class
    assert pod.termination_grace_period_seconds == 120
    # Pinned to the planned node object, and to its GPU product.
    assert pod.affinity is not None
    assert pod.affinity.node_affinity is not None
    terms = pod.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    assert terms is not None
    [term] = terms.node_selector_terms
    assert [(f.key, f.operator, f.values) for f in term.match_fields or []] == [
        ("metadata.name", "In", ["gpu-a"])
    ]
    gpu_a = next(n for n in nodes if n["metadata"]["name"] == "gpu-a")
    assert pod.node_selector == {
        "nvidia.com/gpu.product": gpu_a["metadata"]["labels"]["nvidia.com/gpu.product"]
    }
    assert {(t.key, t.operator) for t in pod.tolerations or []} == {("nvidia.com/gpu", "Exists")}
    # Labels select Berth's objects; the annotation records the planned GPU ids.
    for meta in (job.metadata, job.spec.template.metadata):
        assert meta is not None
        assert meta.labels is not None
        assert meta.annotations is not None
        assert meta.labels[JOB_ID_LABEL] == "job-7"
        assert meta.labels["berth.dev/kind"] == kind_label
        assert meta.labels["berth.dev/project"] == "vision"
        assert meta.annotations[GPU_IDS_ANNOTATION] == "1,2"


def test_started_job_shows_up_in_snapshot_with_planned_gpus(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Start then snapshot through the emulator; with no Job controller there, the job stays pending."""
    backend = _backend(emulator, namespace)
    backend.apply(Plan(starts=(_start("job-8", (4, 5, 6), ("gpu-b",)),)), payloads={"job-8": PAYLOAD})

    [job] = backend.snapshot().jobs
    assert (job.job_id, job.state, job.gpu_ids) == ("job-8", ObservedState.PENDING, (4, 5, 6))
    assert job.backend_ref == job_name("job-8")


def test_repeating_a_start_is_success_and_a_different_start_is_refused(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """The emulator answers 409 AlreadyExists to the second create, like the real API server."""
    backend = _backend(emulator, namespace, payload_source={"job-9": PAYLOAD}.get)
    plan = Plan(starts=(_start("job-9", (0,), ("gpu-a",)),))

    first, again = backend.apply(plan), backend.apply(plan)
    assert first[0].is_ok
    assert again[0].is_ok
    assert "already exists" in again[0].message

    other = backend.apply(Plan(starts=(_start("job-9", (3,), ("gpu-a",)),)))
    assert not other[0].is_ok
    assert _read_job(emulator, namespace, job_name("job-9")).metadata.annotations[GPU_IDS_ANNOTATION] == "0"


@pytest.mark.parametrize(
    ("metadata", "status", "expected"),
    [
        (
            {"deletionTimestamp": "2026-11-30T08:00:00Z", "finalizers": ["foregroundDeletion"]},
            {},
            "being deleted",
        ),
        ({}, {"conditions": [{"type": "Complete", "status": "True"}]}, "has finished"),
    ],
)
def test_start_over_a_deleting_or_finished_job_of_that_name_is_refused(
    emulator: Emulator,
    nodes: list[dict[str, Any]],
    namespace: str,
    metadata: dict[str, Any],
    status: dict[str, Any],
    expected: str,
) -> None:
    """The Job of an earlier attempt is seeded into the emulator (its 409 is real, the state is seeded)."""
    job_id = "job-14"
    emulator.put(
        JOBS,
        namespace,
        {
            "metadata": {
                "name": job_name(job_id),
                "labels": {JOB_ID_LABEL: job_id},
                "annotations": {"berth.dev/job-id": job_id, GPU_IDS_ANNOTATION: "0"},
                **metadata,
            },
            "spec": {"template": {"spec": {"containers": [{"name": "main", "image": PAYLOAD.image}]}}},
            "status": status,
        },
    )
    [result] = _backend(emulator, namespace).apply(
        Plan(starts=(_start(job_id, (0,), ("gpu-a",)),)), payloads={job_id: PAYLOAD}
    )
    assert not result.is_ok
    assert expected in result.message


def test_multi_node_start_is_an_indexed_job_with_one_pod_per_node(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Created in and read back from the emulator."""
    backend = _backend(emulator, namespace)
    action = _start("job-10", (4, 5, 6, 7, 8, 9, 10, 11), ("gpu-b", "gpu-c"))
    [result] = backend.apply(Plan(starts=(action,)), payloads={"job-10": PAYLOAD})
    assert result.is_ok

    job = _read_job(emulator, namespace, job_name("job-10"))
    assert job.spec is not None
    assert job.spec.template.spec is not None
    assert (job.spec.parallelism, job.spec.completions, job.spec.completion_mode) == (2, 2, "Indexed")
    pod = job.spec.template.spec
    assert pod.containers[0].resources.limits == {"nvidia.com/gpu": "4"}
    terms = pod.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    assert terms.node_selector_terms[0].match_fields[0].values == ["gpu-b", "gpu-c"]
    [anti] = pod.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution
    assert anti.topology_key == "kubernetes.io/hostname"
    # gpu-b and gpu-c carry different products (nodes.json): one template cannot select both.
    assert pod.node_selector is None


def test_start_without_payload_or_with_uneven_split_fails_without_writing(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Checks the emulator's request log: neither action may send a request."""
    backend = _backend(emulator, namespace)
    mark = emulator.request_count()
    results = backend.apply(
        Plan(starts=(_start("job-11", (0,), ("gpu-a",)), _start("job-12", (0, 1, 2), ("gpu-a", "gpu-b")))),
        payloads={"job-12": PAYLOAD},
    )
    assert [r.is_ok for r in results] == [False, False]
    assert "payload" in results[0].message
    assert emulator.requests_since(mark) == []


def test_dry_run_sends_writes_with_dry_run_all(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Checks the queries the emulator received; it ignores dryRun (a real server would persist nothing),
    so the Job really appears there and the preemption finds it.  The pod is seeded (no Job controller)."""
    backend = _backend(emulator, namespace, dry_run=True)
    mark = emulator.request_count()
    [result] = backend.apply(Plan(starts=(_start("job-13", (0,), ("gpu-a",)),)), payloads={"job-13": PAYLOAD})
    assert result.is_ok
    assert result.message.startswith("dry run")
    emulator.put(PODS, namespace, _pod_of("job-13"))
    [stopped] = backend.apply(Plan(preemptions=(PreemptAction("job-13", 1_000.0, 1_030.0, "booking"),)))
    assert stopped.message.startswith("dry run")

    writes = [r for r in emulator.requests_since(mark) if r.method != "GET"]
    assert sorted(r.method for r in writes) == ["DELETE", "DELETE", "PATCH", "POST"]
    assert all(r.params.get("dryRun") == "All" for r in writes)


def test_bearer_token_is_sent(emulator: Emulator, nodes: list[dict[str, Any]]) -> None:
    """The emulator accepts any token; the test checks the header it received."""
    mark = emulator.request_count()
    _backend(emulator, "research", token="s3cr3t").snapshot()
    assert {r.headers.get("Authorization") for r in emulator.requests_since(mark)} == {"Bearer s3cr3t"}


def test_engine_round_through_the_backend(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """One engine round end to end: the backend's snapshot feeds `plan_round`, its plan goes back through
    `apply`, and the next snapshot reports the job on the GPUs the engine chose.  Nodes seeded from
    k8s_data/nodes.json; the emulator runs no Job controller, so the job stays pending."""
    backend = _backend(emulator, namespace)
    observed = backend.snapshot()
    gpu_types = tuple(GpuType(name=name) for name in sorted({n.gpu_type for n in observed.nodes}))
    request = JobRequest(
        id="e2e-1", user="ana", project="vision", gpu_count=2, submit_at=0.0, gpu_type="A100"
    )
    snapshot = ClusterSnapshot(cluster="k8s", gpu_types=gpu_types, nodes=observed.nodes, pending=(request,))

    plan = plan_round(snapshot, PolicyConfig(name="fifo"), now=1_000.0)
    [start] = plan.starts
    [node] = [n for n in observed.nodes if n.id in start.node_ids]
    assert node.status is NodeStatus.UP  # the engine only uses what the backend reported as up
    assert set(start.gpu_ids) <= set(node.gpu_ids)

    assert [r.is_ok for r in backend.apply(plan, payloads={"e2e-1": PAYLOAD})] == [True]
    job = _read_job(emulator, namespace, job_name("e2e-1"))
    term = job.spec.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    assert term.node_selector_terms[0].match_fields[0].values == list(start.node_ids)
    [seen] = backend.snapshot().jobs
    assert (seen.job_id, seen.gpu_ids) == ("e2e-1", start.gpu_ids)


# ---- preempt, cancel, reservations ----


def test_preempt_deletes_pods_and_job_with_the_grace_period(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Job created through the backend; its pod seeded (the emulator has no Job controller to create it).

    The grace period is checked in the requests the emulator received.  A pod of another job lives in the
    same namespace: the emulator ignores label selectors, so this also checks that it is never touched.
    """
    backend = _backend(emulator, namespace)
    backend.apply(Plan(starts=(_start("job-20", (0, 1), ("gpu-a",)),)), payloads={"job-20": PAYLOAD})
    emulator.put(PODS, namespace, _pod_of("job-20", gpu_ids="0,1"))
    bystander = _pod_of("job-21", gpu_ids="2")
    emulator.put(PODS, namespace, bystander)
    preempt = PreemptAction(job_id="job-20", signal_at=1_000.0, kill_at=1_045.2, reason="booking b-1 starts")

    mark = emulator.request_count()
    [result] = backend.apply(Plan(preemptions=(preempt,)))

    assert (result.action, result.target_id, result.is_ok) == ("preempt", "job-20", True)
    grace = "46"  # ceil(kill_at - signal_at): never shorter than the plan promised
    requests = emulator.requests_since(mark)
    patches = [r for r in requests if r.method == "PATCH"]
    deletes = [r for r in requests if r.method == "DELETE"]
    assert [(r.resource, r.name) for r in patches] == [(PODS, "berth-job-20-x1")]
    assert patches[0].data["metadata"]["annotations"][STOP_REASON_ANNOTATION] == "preempted"
    assert [(r.resource, r.name, r.params.get("gracePeriodSeconds")) for r in deletes] == [
        (JOBS, job_name("job-20"), grace),
        (PODS, "berth-job-20-x1", grace),
    ]
    assert deletes[0].params.get("propagationPolicy") == "Background"
    assert not emulator.exists(JOBS, namespace, job_name("job-20"))
    assert emulator.exists(PODS, namespace, bystander["metadata"]["name"])

    # Repeating it finds nothing left (404s) and is still success.
    [again] = backend.apply(Plan(preemptions=(preempt,)))
    assert again.is_ok
    assert "already gone" in again.message


def test_preempt_waits_for_signal_at_and_leaves_terminating_pods_alone(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Seeded pods (no Job controller in the emulator); the emulator's request log shows what was sent.

    The backend's clock says 1000: a preemption signalled at 1010 sends nothing yet.  Applied when due, a
    pod already in its grace period (an earlier round deleted it) is not deleted again.
    """
    backend = _backend(emulator, namespace)
    backend.apply(Plan(starts=(_start("job-22", (0,), ("gpu-a",)),)), payloads={"job-22": PAYLOAD})
    pod = _pod_of("job-22")
    pod["metadata"]["deletionTimestamp"] = "2026-11-30T08:20:30Z"
    emulator.put(PODS, namespace, pod)

    mark = emulator.request_count()
    [early] = backend.apply(Plan(preemptions=(PreemptAction("job-22", 1_010.0, 1_040.0, "booking"),)))
    assert early.is_ok
    assert "due" in early.message
    assert emulator.requests_since(mark) == []

    [due] = backend.apply(Plan(preemptions=(PreemptAction("job-22", 990.0, 1_020.0, "booking"),)))
    assert due.is_ok
    sent = [(r.method, r.resource, r.name) for r in emulator.requests_since(mark) if r.method != "GET"]
    assert sent == [("DELETE", JOBS, job_name("job-22"))]
    assert emulator.exists(PODS, namespace, pod["metadata"]["name"])


def test_cancel_deletes_with_the_configured_grace(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Job created through the backend in the emulator; the delete's query is read from its request log."""
    backend = _backend(emulator, namespace, termination_grace_s=15)
    backend.apply(Plan(starts=(_start("job-30", (0,), ("gpu-a",)),)), payloads={"job-30": PAYLOAD})

    mark = emulator.request_count()
    result = backend.cancel("job-30")

    assert (result.action, result.is_ok) == ("cancel", True)
    [delete] = [r for r in emulator.requests_since(mark) if r.method == "DELETE"]
    assert delete.params.get("gracePeriodSeconds") == "15"
    assert not emulator.exists(JOBS, namespace, job_name("job-30"))
    assert backend.cancel("job-30").is_ok  # already gone


def test_reservations_and_releases_say_kubernetes_has_none(emulator: Emulator, namespace: str) -> None:
    """No API involved: the backend must not send any request for them (checked in the emulator's log)."""
    mark = emulator.request_count()
    results = _backend(emulator, namespace).apply(
        Plan(
            reservations=(ReserveAction(holder_id="b-1", gpu_ids=(0, 1), start_at=10.0, end_at=20.0),),
            releases=(ReleaseAction(holder_id="b-2", gpu_ids=(2,), reason="not in use"),),
        )
    )
    assert [(r.action, r.target_id, r.is_ok) for r in results] == [
        ("reserve", "b-1", True),
        ("release", "b-2", True),
    ]
    assert all("no reservations" in r.message for r in results)
    assert emulator.requests_since(mark) == []


# ---- configuration and payloads ----


def test_kubeconfig_with_token_reaches_the_server(
    emulator: Emulator, nodes: list[dict[str, Any]], tmp_path: Path
) -> None:
    """A kubeconfig file pointing at the emulator; the token is checked in the request it received."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "lab", "cluster": {"server": emulator.url}}],
                "users": [{"name": "berth", "user": {"token": "from-kubeconfig"}}],
                "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "berth"}}],
                "current-context": "lab",
            }
        )
    )
    backend = KubernetesBackend(KubernetesConfig.from_env({"BERTH_K8S_KUBECONFIG": str(path)}))
    mark = emulator.request_count()
    assert {n.id for n in backend.snapshot().nodes} >= {"gpu-a", "gpu-b"}
    assert {r.headers.get("Authorization") for r in emulator.requests_since(mark)} == {
        "Bearer from-kubeconfig"
    }


def test_config_from_env() -> None:
    """Pure: no API."""
    env = {
        "BERTH_K8S_HOST": "https://k8s.lab:6443",
        "BERTH_K8S_TOKEN": "t",
        "BERTH_K8S_NAMESPACE": "gpu-jobs",
        "BERTH_K8S_DRY_RUN": "yes",
    }
    config = KubernetesConfig.from_env(env)
    assert (config.host, config.token, config.namespace, config.dry_run) == (
        "https://k8s.lab:6443",
        "t",
        "gpu-jobs",
        True,
    )
    assert KubernetesConfig.from_env({}) == KubernetesConfig()


def test_not_in_a_cluster_becomes_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-cluster configuration outside a pod: the service-account environment is absent here."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(BackendError, match="configuration"):
        KubernetesBackend(KubernetesConfig(in_cluster=True))


def test_payload_from_mapping() -> None:
    """Pure: no API."""
    payload = JobPayload.from_mapping(
        {"image": "ghcr.io/lab/nb:3", "command": "jupyter lab", "kind": "interactive", "env": {"A": "1"}}
    )
    assert payload.command == ("/bin/sh", "-c", "jupyter lab")
    assert payload.kind is JobKind.INTERACTIVE
    assert payload.env == {"A": "1"}
    for bad in ({}, {"image": ""}, {"image": "x", "args": "not-a-list"}, {"image": "x", "env": {"A": 1}}):
        with pytest.raises(ValueError, match="payload"):
            JobPayload.from_mapping(bad)


def test_start_with_mapping_payload_and_a_bad_one(
    emulator: Emulator, nodes: list[dict[str, Any]], namespace: str
) -> None:
    """Created in and read back from the emulator; the bad payload sends nothing."""
    backend = _backend(emulator, namespace)
    good = {"image": "ghcr.io/lab/train:2", "args": ["--lr", "3e-4"]}
    results = backend.apply(
        Plan(starts=(_start("job-15", (0,), ("gpu-a",)), _start("job-16", (1,), ("gpu-a",)))),
        payloads={"job-15": good, "job-16": {"command": ["python"]}},
    )
    assert [r.is_ok for r in results] == [True, False]
    assert "image" in results[1].message
    container = _read_job(emulator, namespace, job_name("job-15")).spec.template.spec.containers[0]
    assert (container.image, container.args) == ("ghcr.io/lab/train:2", ["--lr", "3e-4"])
    assert not emulator.exists(JOBS, namespace, job_name("job-16"))


# ---- names ----


@pytest.mark.parametrize(
    "job_id", ["42", "job-7", "Job_7", "a" * 80, "2f1c6a8e-3d3b-4c53-9b0e-6c1f1c3a9e11", "x/y z"]
)
def test_job_names_are_dns_labels_and_label_values(job_id: str) -> None:
    """Pure functions, no API."""
    name = job_name(job_id)
    assert len(name) <= 63
    assert name == name.lower()
    assert all(c.isalnum() or c == "-" for c in name)
    assert name[0].isalnum()
    assert name[-1].isalnum()
    assert job_name(job_id) == name  # stable
    value = job_label_value(job_id)
    assert len(value) <= 63


def test_job_names_keep_distinct_ids_apart() -> None:
    """Pure functions, no API."""
    ids = ["Job_7", "job-7", "job_7", "JOB-7", "a" * 80, "a" * 81]
    assert len({job_name(i) for i in ids}) == len(ids)
    assert len({job_label_value(i) for i in ids}) == len(ids)


# ---- errors ----


Answer = Callable[[str, str, dict[str, str]], tuple[int, dict[str, Any]]]  # method, path, query -> reply


class _LocalApi(http.server.BaseHTTPRequestHandler):
    """A tiny HTTP API on 127.0.0.1: ``answer`` decides each reply; ``seen`` records every request."""

    answer: Answer
    seen: list[tuple[str, str, dict[str, str]]]

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        self.seen.append((self.command, url.path, query))
        code, reply = self.answer(self.command, url.path, query)
        body = json.dumps(reply).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest output clean


def _status(code: int, **by_method: int) -> Answer:
    """Every request fails with a Kubernetes Status document; ``by_method`` gives some methods other codes."""
    reasons = {403: "Forbidden", 404: "NotFound", 422: "Invalid", 500: "InternalError"}

    def answer(method: str, path: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        status = by_method.get(method, code)
        return status, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"injected failure {status}",
            "reason": reasons.get(status, "Unknown"),
            "code": status,
        }

    return answer


@pytest.fixture
def local_api() -> Iterator[Callable[[Answer], tuple[str, list[tuple[str, str, dict[str, str]]]]]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def serve(answer: Answer) -> tuple[str, list[tuple[str, str, dict[str, str]]]]:
        seen: list[tuple[str, str, dict[str, str]]] = []
        handler = type("Handler", (_LocalApi,), {"answer": staticmethod(answer), "seen": seen})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", seen

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def failing_api(
    local_api: Callable[[Answer], tuple[str, list[tuple[str, str, dict[str, str]]]]],
) -> Callable[..., str]:
    def serve(code: int, **by_method: int) -> str:
        return local_api(_status(code, **by_method))[0]

    return serve


@pytest.mark.parametrize("code", [500, 403])
def test_api_errors_become_backend_error(failing_api: Callable[..., str], code: int) -> None:
    """Errors from the tiny local Status handler: the emulator cannot be told to fail like this."""
    backend = KubernetesBackend(KubernetesConfig(host=failing_api(code), namespace="research", timeout_s=5.0))
    with pytest.raises(BackendError, match=f"HTTP {code}: injected failure"):
        backend.snapshot()
    with pytest.raises(BackendError, match=f"HTTP {code}"):
        backend.apply(Plan(starts=(_start("job-40", (0,), ("gpu-a",)),)), payloads={"job-40": PAYLOAD})
    with pytest.raises(BackendError, match=f"HTTP {code}"):
        backend.apply(Plan(preemptions=(PreemptAction("job-40", 0.0, 30.0, "test"),)))


def test_invalid_object_is_a_failed_result_not_an_error(failing_api: Callable[..., str]) -> None:
    """422 to the create from the tiny local Status handler, as the API server answers an invalid object.

    Its GETs answer 404, so the node's product label is unknown and the Job simply goes without that selector.
    """
    host = failing_api(422, GET=404)
    backend = KubernetesBackend(KubernetesConfig(host=host, namespace="research", timeout_s=5.0))
    [result] = backend.apply(Plan(starts=(_start("job-41", (0,), ("gpu-a",)),)), payloads={"job-41": PAYLOAD})
    assert not result.is_ok
    assert "422" in result.message
    assert "injected failure" in result.message


def test_snapshot_follows_list_pages(
    local_api: Callable[[Answer], tuple[str, list[tuple[str, str, dict[str, str]]]]],
) -> None:
    """k8s_data/nodes.json served in two pages by the tiny local API (the emulator ignores ``limit``)."""
    items = _load("nodes.json")

    def answer(method: str, path: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if path == "/api/v1/nodes":
            if query.get("continue") == "page-2":
                return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items[3:]}
            return 200, {
                "kind": "NodeList",
                "apiVersion": "v1",
                "metadata": {"continue": "page-2"},
                "items": items[:3],
            }
        return 200, {"apiVersion": "v1", "metadata": {}, "items": []}

    url, seen = local_api(answer)
    observed = KubernetesBackend(KubernetesConfig(host=url, namespace="research", timeout_s=5.0)).snapshot()

    gpu_names = {n["metadata"]["name"] for n in items if "nvidia.com/gpu" in n["status"]["allocatable"]}
    assert {n.id for n in observed.nodes} == gpu_names
    node_requests = [query for _, path, query in seen if path == "/api/v1/nodes"]
    assert [q.get("continue") for q in node_requests] == [None, "page-2"]
    assert all(q.get("limit") == "500" for q in node_requests)


def test_a_hanging_server_times_out_as_backend_error(
    local_api: Callable[[Answer], tuple[str, list[tuple[str, str, dict[str, str]]]]],
) -> None:
    """The tiny local API answers only after 2 s; the backend gives up after its 0.3 s timeout."""

    def slow(method: str, path: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        time.sleep(2.0)
        return 200, {"apiVersion": "v1", "metadata": {}, "items": []}

    url, _ = local_api(slow)
    backend = KubernetesBackend(KubernetesConfig(host=url, namespace="research", timeout_s=0.3))
    began = time.monotonic()
    with pytest.raises(BackendError, match="list nodes"):
        backend.snapshot()
    assert time.monotonic() - began < 1.5


def test_connection_refused_becomes_backend_error() -> None:
    """A port nothing listens on (bound, then closed) on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = KubernetesBackend(
        KubernetesConfig(host=f"http://127.0.0.1:{port}", namespace="x", timeout_s=2.0)
    )
    with pytest.raises(BackendError, match="list nodes"):
        backend.snapshot()
    with pytest.raises(BackendError):
        backend.cancel("job-42")


def test_bad_kubeconfig_becomes_backend_error(tmp_path: Path) -> None:
    """A kubeconfig file with no contexts; nothing is contacted."""
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(BackendError, match="configuration"):
        KubernetesBackend(KubernetesConfig(kubeconfig=str(path)))
