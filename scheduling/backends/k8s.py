"""Kubernetes backend: Berth jobs as batch/v1 Jobs, driven through the official ``kubernetes`` client.

The module is named ``k8s`` so that it never shadows the ``kubernetes`` client package.

Configuration (`KubernetesConfig`)
    Exactly one way to reach the API server: ``host`` (+ ``token``, ``ca_cert``, ``verify_ssl``) for an
    explicit endpoint, ``in_cluster=True`` for the pod's service account, or ``kubeconfig`` (+ ``context``);
    with none of them set the default kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``) is loaded.
    `KubernetesConfig.from_env` reads ``BERTH_K8S_*`` variables (the backend's default when no config is
    given); secrets such as the token belong there, not in the cluster's stored settings.
    ``namespace`` holds every Berth Job.  ``timeout_s`` bounds every request and the client does not retry:
    the Celery task that called us retries on `BackendError`.  ``dry_run=True`` sends every write with the
    server-side ``dryRun=All``, so the API server validates and admits the object but persists nothing;
    reads are real.

Nodes and GPU ids
    `snapshot` lists the cluster's nodes.  A node counts when its allocatable ``nvidia.com/gpu``
    (``gpu_resource``) is at least 1; CPU-only nodes are not reported.  Its Berth GPU type is the value of
    the ``nvidia.com/gpu.product`` label (``gpu_product_label``, as set by NVIDIA GPU feature discovery)
    mapped through ``gpu_types`` (unmapped products keep the raw label value; a node without the label is
    ``unknown_gpu_type``).  Status: ``down`` when the ``Ready`` condition is not ``True`` or the node
    carries the not-ready/unreachable taint; ``draining`` when it is cordoned (``spec.unschedulable``) or
    carries a ``NoSchedule``/``NoExecute`` taint Berth pods do not tolerate (``tolerations`` lists the taint
    keys Berth pods tolerate, ``nvidia.com/gpu`` by default, because dedicated GPU nodes are commonly
    tainted with it); else ``up``.  Kubernetes has no GPU ids, so Berth numbers them: from ``gpu_ids`` (node
    name -> ids) when that mapping is configured, else deterministically by sorting GPU nodes by name in
    natural order (gpu-2 before gpu-10, as the Slurm backend does) and numbering their GPUs consecutively,
    above any configured id.  The enumeration shifts when a node is added, removed or changes its
    GPU count, which would mislabel the GPUs of jobs already running: production clusters should configure
    ``gpu_ids``.

Jobs, labels and annotations
    Each `StartAction` becomes one batch/v1 Job named ``berth-<job id>`` (sanitised to a DNS label), with
    ``backoffLimit: 0`` (Berth, not Kubernetes, decides about retries), pinned to the planned node by a
    required node affinity on ``metadata.name`` and selecting the node's GPU product label, requesting and
    limiting ``nvidia.com/gpu: n``, with ``priorityClassName`` from ``priority_classes`` (preemptible when
    the action is preemptible, else interactive or batch from the payload's kind).  A multi-node start
    becomes an Indexed Job with one pod per node (node affinity to the planned set plus pod anti-affinity on
    the hostname) and needs the same GPU count on every node.  Image, command, args, environment and extra
    requests come from a `JobPayload` (or a mapping for `JobPayload.from_mapping`) the caller supplies per
    job id (the Plan carries only ids): pass ``payloads`` to `apply` or a ``payload_source`` to the
    constructor; a missing or unusable payload is a failed result for that start.  The PriorityClass
    objects are the cluster admin's (Berth does not create them; a pod naming a missing class is refused
    by admission and the Job stays without pods).  Give them ``preemptionPolicy: Never`` so that
    kube-scheduler never preempts on its own: preemption is Berth's decision, with Berth's grace.  Job and
    pod template carry:

    - label ``berth.dev/job-id``: the Berth job id (a hash when the id is not a valid label value); selects
      Berth's objects;
    - label ``app.kubernetes.io/managed-by: berth`` and ``berth.dev/kind``;
    - annotation ``berth.dev/job-id``: the exact Berth job id;
    - annotation ``berth.dev/gpu-ids``: the planned GPU ids, comma separated.  Kubernetes' device plugin
      picks the devices itself and exposes no device index, so the ids Berth reports are the ones it
      *planned* when it created the Job, read back from this annotation;
    - annotation ``berth.dev/stop-reason`` (pods only): ``preempted`` or ``cancelled``, written just before
      Berth deletes a pod, so that a terminating pod is reported for what it is.

    Job/pod state maps to `ObservedState`: Job condition ``Complete`` -> completed, ``Failed`` -> failed
    (preempted when Kubernetes' own scheduler preempted the pod); a running pod -> running; a Job with no
    pod yet or a pending pod -> pending; a pod in phase ``Unknown`` -> lost; terminating pods -> preempted
    or cancelled after their stop reason, with their GPU ids still reported (the GPUs are busy until the pod
    is gone) and no end time yet.  Once Kubernetes has removed everything Berth no longer sees the job: the
    database knows it asked for the stop.

Preemption and cancel
    `PreemptAction`: delete the Job with ``propagationPolicy=Background`` and grace
    ``ceil(kill_at - signal_at)`` seconds, then annotate and delete each of its pods with the same grace
    (the kubelet sends SIGTERM now and SIGKILL after the grace).  The Job goes first so that its controller
    never counts or replaces a deleted pod.  The explicit pod deletes matter: the Job's own grace period is
    not passed on to its pods (kubernetes/kubernetes#25055), the garbage collector deletes them with the
    pod template's ``terminationGracePeriodSeconds`` (``termination_grace_s``), and a grace
    period, once set, can only shrink (kubernetes/kubernetes#8641); so the effective grace on a real
    cluster is ``min(planned, termination_grace_s)``: set ``termination_grace_s`` to at least the longest
    grace the policy grants.  `KubernetesBackend.cancel` does the same with ``termination_grace_s``.
    Before ``signal_at`` nothing is sent (as in the Slurm backend, a plan may be applied every round);
    pods already terminating are left alone.  Deleting what is already gone (404) is success; so is
    creating a Job that already exists for the same plan (409).  A 409 from a Job of an earlier attempt
    (still being deleted, finished, or on other GPUs) is a failed result: the next round retries.

Not supported
    Reservations: Kubernetes has none; `ReserveAction`/`ReleaseAction` succeed with a message saying so,
    because bookings are enforced by the engine holding the GPUs (nothing else schedules on them through
    Berth).  GPUs used by pods Berth did not create are invisible to the engine (allocatable is capacity,
    not use): keep the GPU nodes Berth schedules on dedicated to it.  Suspend/resume, checkpoint signals
    other than SIGTERM, GPU telemetry (idle detection) and watch streams are not implemented.

Errors
    Connection failures, timeouts, 401/403, 429 and 5xx raise `BackendError` (the caller retries the whole
    plan; every action is idempotent).  A 400/422 rejection of one object (an invalid image name, say) is
    specific to that action and comes back as a failed `ActionResult`, so one bad payload does not block the
    rest of the plan.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from pydantic import ValidationError

from scheduling.backends.base import (
    ActionResult,
    BackendError,
    JobOutput,
    ObservedCluster,
    ObservedJob,
    ObservedState,
    tail,
)
from scheduling.engine.types import (
    JobKind,
    Node,
    NodeStatus,
    Plan,
    PreemptAction,
    ReleaseAction,
    ReserveAction,
    StartAction,
)

JOB_ID_LABEL = "berth.dev/job-id"
KIND_LABEL = "berth.dev/kind"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
JOB_ID_ANNOTATION = "berth.dev/job-id"
GPU_IDS_ANNOTATION = "berth.dev/gpu-ids"
STOP_REASON_ANNOTATION = "berth.dev/stop-reason"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# Taints the node lifecycle controller sets on a node that stopped reporting: the node is down, not draining.
_DOWN_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# A label value: up to 63 alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric.
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")

_T = TypeVar("_T")
_I = TypeVar("_I")
_I_co = TypeVar("_I_co", covariant=True)
_PAGE_SIZE = 500  # kubectl's chunk size
_MAX_PAGES = 1_000  # 500k objects: far beyond any cluster; bounds the loop should a server keep answering


class _Page(Protocol[_I_co]):
    """One page of a list call (V1NodeList, V1JobList, V1PodList)."""

    @property
    def items(self) -> Sequence[_I_co]: ...

    @property
    def metadata(self) -> k8s_client.V1ListMeta | None: ...


@dataclass(frozen=True, slots=True)
class PriorityClasses:
    """Names of the PriorityClass objects for each class of Berth work (created by the cluster admin)."""

    interactive: str = "berth-interactive"
    batch: str = "berth-batch"
    preemptible: str = "berth-preemptible"


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    """How to reach the cluster and how Berth's objects look in it; see the module docstring."""

    namespace: str = "berth"
    host: str | None = None  # explicit API server URL; wins over kubeconfig and in-cluster
    token: str | None = None  # bearer token for ``host``
    ca_cert: str | None = None  # CA bundle path for ``host``
    verify_ssl: bool = True
    in_cluster: bool = False
    kubeconfig: str | None = None  # path; None with no host and not in-cluster: the default kubeconfig
    context: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    gpu_product_label: str = "nvidia.com/gpu.product"
    gpu_types: Mapping[str, str] = field(default_factory=dict)  # product label value -> Berth GPU type
    unknown_gpu_type: str = "unknown"
    gpu_ids: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # node name -> Berth GPU ids
    domain_label: str | None = None  # node label giving the topology domain, e.g. a rack label
    priority_classes: PriorityClasses = PriorityClasses()
    tolerations: tuple[str, ...] = ("nvidia.com/gpu",)  # taint keys Berth pods tolerate (operator Exists)
    termination_grace_s: int = 30  # pod template terminationGracePeriodSeconds and the cancel grace
    timeout_s: float = 10.0  # connect and read timeout of every request
    dry_run: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KubernetesConfig:
        """Build a config from ``BERTH_K8S_*`` environment variables; unset ones keep the defaults.

        ``BERTH_K8S_HOST``, ``BERTH_K8S_TOKEN``, ``BERTH_K8S_CA_CERT``, ``BERTH_K8S_IN_CLUSTER`` (1/true/yes),
        ``BERTH_K8S_KUBECONFIG``, ``BERTH_K8S_CONTEXT``, ``BERTH_K8S_NAMESPACE``, ``BERTH_K8S_DRY_RUN``.
        """
        env = os.environ if env is None else env
        base = cls()

        def flag(name: str) -> bool:
            return env.get(name, "").strip().lower() in {"1", "true", "yes"}

        return cls(
            namespace=env.get("BERTH_K8S_NAMESPACE") or base.namespace,
            host=env.get("BERTH_K8S_HOST") or None,
            token=env.get("BERTH_K8S_TOKEN") or None,
            ca_cert=env.get("BERTH_K8S_CA_CERT") or None,
            in_cluster=flag("BERTH_K8S_IN_CLUSTER"),
            kubeconfig=env.get("BERTH_K8S_KUBECONFIG") or None,
            context=env.get("BERTH_K8S_CONTEXT") or None,
            dry_run=flag("BERTH_K8S_DRY_RUN"),
        )


@dataclass(frozen=True, slots=True)
class JobPayload:
    """What to run for one Berth job: the container, its environment and extra resource requests."""

    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    kind: JobKind = JobKind.BATCH
    requests: Mapping[str, str] = field(default_factory=dict)  # e.g. {"cpu": "8", "memory": "64Gi"}
    labels: Mapping[str, str] = field(default_factory=dict)  # extra labels, e.g. project and user
    service_account: str | None = None
    active_deadline_s: int | None = None  # hard wall-clock limit; None: the job runs until it ends

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> JobPayload:
        """Build a payload from a job's stored backend payload (JSON); raise `ValueError` when unusable.

        ``image`` is required; ``command`` and ``args`` are lists of strings (a string ``command`` runs
        through ``/bin/sh -c``); ``env``, ``requests`` and ``labels`` map strings to strings; ``kind`` is
        ``batch`` or ``interactive``.
        """
        image = data.get("image")
        if not isinstance(image, str) or not image.strip():
            raise ValueError("payload needs a non-empty 'image'")
        command = data.get("command") or ()
        if isinstance(command, str):
            command = ("/bin/sh", "-c", command)
        try:
            return cls(
                image=image,
                command=_strings("command", command),
                args=_strings("args", data.get("args") or ()),
                env=_string_map("env", data.get("env") or {}),
                kind=JobKind(data.get("kind") or JobKind.BATCH),
                requests=_string_map("requests", data.get("requests") or {}),
                labels=_string_map("labels", data.get("labels") or {}),
                service_account=data.get("service_account") or None,
                active_deadline_s=data.get("active_deadline_s") or None,
            )
        except TypeError as exc:
            raise ValueError(str(exc)) from exc


PayloadSource = Callable[[str], "JobPayload | Mapping[str, Any] | None"]


def _strings(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"payload '{name}' must be a list of strings")
    return tuple(value)


def _string_map(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TypeError(f"payload '{name}' must map strings to strings")
    return dict(value)


def job_name(job_id: str) -> str:
    """The Kubernetes Job name for a Berth job id: a DNS-1123 label, stable for a given id.

    Ids that are already lowercase alphanumerics and dashes keep their text; any other id gets a hash
    suffix so that two ids differing only in case or punctuation never share a name.
    """
    clean = _NOT_DNS.sub("-", job_id.lower()).strip("-")
    if clean and clean == job_id and len(clean) <= 57:
        return f"berth-{clean}"
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:10]
    return f"berth-{clean[:46]}-{digest}" if clean else f"berth-{digest}"


def job_label_value(job_id: str) -> str:
    """The ``berth.dev/job-id`` label value: the id itself when it is a valid label value, else a hash."""
    if _LABEL_VALUE.match(job_id) and job_id:
        return job_id
    return "h-" + hashlib.sha256(job_id.encode()).hexdigest()[:40]


class KubernetesBackend:
    """`ClusterBackend` for one Kubernetes cluster (one namespace holds Berth's Jobs)."""

    def __init__(
        self,
        config: KubernetesConfig | None = None,
        *,
        payload_source: PayloadSource | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Connect lazily (no request is made here); ``config`` defaults to `KubernetesConfig.from_env`.

        Raises `BackendError` when the kubeconfig or in-cluster configuration cannot be loaded.
        """
        config = config if config is not None else KubernetesConfig.from_env()
        self.config = config
        self._payload_source = payload_source
        self._clock = clock
        self._api_client = k8s_client.ApiClient(_client_configuration(config))
        self._core = k8s_client.CoreV1Api(self._api_client)
        self._batch = k8s_client.BatchV1Api(self._api_client)
        # The GPU product label of each node from the last snapshot; a start needs it for the node selector.
        self._node_products: dict[str, str] = {}

    def close(self) -> None:
        """Release the connection pool."""
        self._api_client.close()  # type: ignore[no-untyped-call]

    # ---- snapshot ----

    def snapshot(self) -> ObservedCluster:
        """Read nodes, GPU capacity and Berth's Jobs and pods; raise `BackendError` when the API fails."""
        at = self._clock()
        timeout = self._timeout()
        limit = _PAGE_SIZE
        node_items = self._list_all(
            "list nodes",
            lambda token: self._core.list_node(limit=limit, _continue=token, _request_timeout=timeout),
        )
        nodes = self._nodes(node_items)
        namespace = self.config.namespace
        job_items = self._list_all(
            "list jobs",
            lambda token: self._batch.list_namespaced_job(
                namespace, label_selector=JOB_ID_LABEL, limit=limit, _continue=token, _request_timeout=timeout
            ),
        )
        pod_items = self._list_all(
            "list pods",
            lambda token: self._core.list_namespaced_pod(
                namespace, label_selector=JOB_ID_LABEL, limit=limit, _continue=token, _request_timeout=timeout
            ),
        )
        jobs = _observed_jobs(job_items, pod_items)
        return ObservedCluster(at=at, nodes=nodes, jobs=jobs)

    def _nodes(self, items: Iterable[k8s_client.V1Node]) -> tuple[Node, ...]:
        config = self.config
        gpu_nodes: list[tuple[str, int, k8s_client.V1Node]] = []
        for item in items:
            name = item.metadata.name if item.metadata else None
            allocatable = item.status.allocatable if item.status else None
            count = _gpu_count((allocatable or {}).get(config.gpu_resource))
            if name and count > 0:
                gpu_nodes.append((name, count, item))
        gpu_nodes.sort(key=lambda entry: _natural_key(entry[0]))

        nodes: list[Node] = []
        self._node_products = {}
        # Enumerated ids start above every configured one, so a partial mapping never collides with them.
        next_id = max((gpu for ids in config.gpu_ids.values() for gpu in ids), default=-1) + 1
        for name, count, item in gpu_nodes:
            labels = (item.metadata.labels if item.metadata else None) or {}
            product = labels.get(config.gpu_product_label)
            if product:
                self._node_products[name] = product
            gpu_type = config.gpu_types.get(product, product) if product else config.unknown_gpu_type
            if name in config.gpu_ids:
                # Fewer allocatable GPUs than mapped ids (the device plugin reports one unhealthy): which
                # one is unknown, so the node reports as many ids as it has GPUs.
                gpu_ids = tuple(config.gpu_ids[name])[:count]
            else:
                gpu_ids = tuple(range(next_id, next_id + count))
                next_id += count
            domain = labels.get(config.domain_label, "") if config.domain_label else ""
            nodes.append(
                Node(
                    id=name, gpu_type=gpu_type, gpu_ids=gpu_ids, status=self._node_status(item), domain=domain
                )
            )
        return tuple(nodes)

    def _node_status(self, item: k8s_client.V1Node) -> NodeStatus:
        conditions = (item.status.conditions if item.status else None) or []
        ready = next((c for c in conditions if c.type == "Ready"), None)
        taints = (item.spec.taints if item.spec else None) or []
        if ready is None or ready.status != "True" or any(t.key in _DOWN_TAINTS for t in taints):
            return NodeStatus.DOWN
        is_cordoned = bool(item.spec and item.spec.unschedulable)
        blocking = [
            t for t in taints if t.effect in _BLOCKING_EFFECTS and t.key not in self.config.tolerations
        ]
        if is_cordoned or blocking:
            return NodeStatus.DRAINING
        return NodeStatus.UP

    # ---- apply ----

    def apply(
        self, plan: Plan, *, payloads: Mapping[str, JobPayload | Mapping[str, Any]] | None = None
    ) -> list[ActionResult]:
        """Carry out a plan: preemptions first (their grace starts sooner), then starts, then bookkeeping.

        ``payloads`` maps job ids to what they run (a `JobPayload` or a mapping for
        `JobPayload.from_mapping`); ids missing there are asked of the ``payload_source``.  Raises
        `BackendError` when the API cannot be reached or refuses Berth as a whole (see module docstring);
        every action is idempotent, so the caller may apply the same plan again, every round if it likes.
        """
        results: list[ActionResult] = [self._preempt(action) for action in plan.preemptions]
        for start in plan.starts:
            payload = (payloads or {}).get(start.job_id)
            if payload is None and self._payload_source is not None:
                payload = self._payload_source(start.job_id)
            results.append(self._start(start, payload))
        results.extend(_no_reservation(action) for action in plan.reservations)
        results.extend(_no_release(action) for action in plan.releases)
        return results

    def cancel(self, job_id: str, *, grace_s: int | None = None) -> ActionResult:
        """Stop a job for good: delete its pods (grace ``termination_grace_s`` unless given) and its Job."""
        grace = self.config.termination_grace_s if grace_s is None else grace_s
        message = self._stop(job_id, grace_s=grace, reason="cancelled")
        return ActionResult("cancel", job_id, is_ok=True, message=message, backend_ref=job_name(job_id))

    def _preempt(self, action: PreemptAction) -> ActionResult:
        name = job_name(action.job_id)
        if self._clock() < action.signal_at:
            # As in the Slurm backend: a plan may be applied every round; nothing happens before the signal.
            due = datetime.fromtimestamp(action.signal_at, tz=UTC).isoformat(timespec="seconds")
            return ActionResult(
                "preempt", action.job_id, is_ok=True, message=f"signal due at {due}", backend_ref=name
            )
        # Round up: a grace cut short by a fraction of a second still breaks the promise made to the job.
        grace = max(0, math.ceil(action.kill_at - action.signal_at))
        message = self._stop(action.job_id, grace_s=grace, reason="preempted")
        return ActionResult("preempt", action.job_id, is_ok=True, message=message, backend_ref=name)

    def _stop(self, job_id: str, *, grace_s: int, reason: str) -> str:
        namespace = self.config.namespace
        timeout = self._timeout()
        dry_run = self._dry_run()
        name = job_name(job_id)
        pods = self._call(
            "list pods",
            lambda: self._core.list_namespaced_pod(
                namespace,
                label_selector=f"{JOB_ID_LABEL}={job_label_value(job_id)}",
                _request_timeout=timeout,
            ),
        )
        # The Job goes first: were a pod deleted while its Job lives, the Job controller could count it
        # as a failure or replace it.  Its pods then get the planned grace themselves (module docstring).
        had_job = self._call_absent_ok(
            f"delete job {name}",
            lambda: self._batch.delete_namespaced_job(
                name,
                namespace,
                grace_period_seconds=grace_s,
                propagation_policy="Background",
                dry_run=dry_run,
                _request_timeout=timeout,
            ),
        )
        stopped = terminating = 0
        for pod in pods.items:
            pod_name = pod.metadata.name if pod.metadata else None
            # Re-check the selector: a pod of another job must never be deleted, whatever the server sent.
            if pod.metadata is None or not pod_name or _object_job_id(pod.metadata) != job_id:
                continue
            if pod.metadata.deletion_timestamp is not None:
                # Already in its grace period (an earlier round sent this); deleting again changes nothing.
                terminating += 1
                continue
            patch = {"metadata": {"annotations": {STOP_REASON_ANNOTATION: reason}}}
            is_there = self._call_absent_ok(
                f"annotate pod {pod_name}",
                functools.partial(
                    self._core.patch_namespaced_pod,
                    pod_name,
                    namespace,
                    patch,
                    dry_run=dry_run,
                    _request_timeout=timeout,
                ),
            )
            is_there = is_there and self._call_absent_ok(
                f"delete pod {pod_name}",
                functools.partial(
                    self._core.delete_namespaced_pod,
                    pod_name,
                    namespace,
                    grace_period_seconds=grace_s,
                    dry_run=dry_run,
                    _request_timeout=timeout,
                ),
            )
            stopped += int(is_there)
        if not had_job and not stopped:
            still = f"; {terminating} pod(s) still in their grace period" if terminating else ""
            return f"{reason}: Job {name} was already gone{still}"
        prefix = "dry run: " if self.config.dry_run else ""
        return f"{prefix}{reason}: deleted Job {name} and {stopped} pod(s) with a {grace_s} s grace period"

    def job_output(self, job_id: str, *, backend_ref: str = "", tail_lines: int = 200) -> JobOutput:
        """The tail of the job's pod log (``read_namespaced_pod_log``) and the container's exit code.

        The newest pod of the job (by creation time) is read; Kubernetes merges stdout and stderr
        into one log, so ``stderr`` stays empty.  A pod that is gone (the Job was deleted, or
        garbage-collected) yields empty output with the reason in ``source``.
        """
        namespace = self.config.namespace
        timeout = self._timeout()
        pods = self._call(
            "list pods",
            lambda: self._core.list_namespaced_pod(
                namespace,
                label_selector=f"{JOB_ID_LABEL}={job_label_value(job_id)}",
                _request_timeout=timeout,
            ),
        )
        mine = [p for p in pods.items if p.metadata and _object_job_id(p.metadata) == job_id]
        if not mine:
            return JobOutput(stdout="", source=f"no pod of Job {job_name(job_id)} in {namespace}")

        def created(pod: k8s_client.V1Pod) -> float:
            return _epoch(pod.metadata.creation_timestamp if pod.metadata else None) or 0.0

        pod = max(mine, key=created)
        pod_name = str(pod.metadata.name or "") if pod.metadata else ""
        exit_code: int | None = None
        for container in (pod.status.container_statuses if pod.status else None) or []:
            terminated = container.state.terminated if container.state else None
            if terminated is not None and terminated.exit_code is not None:
                exit_code = int(terminated.exit_code)
        try:
            text = self._core.read_namespaced_pod_log(
                pod_name, namespace, tail_lines=tail_lines + 1, _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # the container never started, or the pod is gone
                return JobOutput(stdout="", exit_code=exit_code, source=f"pod {pod_name}: {_describe(exc)}")
            raise _backend_error(f"read log of pod {pod_name}", exc) from exc
        except (urllib3.exceptions.HTTPError, ValidationError) as exc:
            raise _backend_error(f"read log of pod {pod_name}", exc) from exc
        out, cut = tail(str(text or ""), tail_lines)
        return JobOutput(
            stdout=out, exit_code=exit_code, source=f"pod {namespace}/{pod_name}", is_truncated=cut
        )

    def _start(self, action: StartAction, raw_payload: JobPayload | Mapping[str, Any] | None) -> ActionResult:
        name = job_name(action.job_id)
        if raw_payload is None:
            return ActionResult(
                "start", action.job_id, is_ok=False, message="no payload for this job", backend_ref=name
            )
        try:
            payload = (
                raw_payload if isinstance(raw_payload, JobPayload) else JobPayload.from_mapping(raw_payload)
            )
        except ValueError as exc:
            return ActionResult("start", action.job_id, is_ok=False, message=str(exc), backend_ref=name)
        if not action.node_ids or not action.gpu_ids or len(action.gpu_ids) % len(action.node_ids):
            return ActionResult(
                "start",
                action.job_id,
                is_ok=False,
                message=f"{len(action.gpu_ids)} GPUs do not split evenly over {len(action.node_ids)} node(s)",
                backend_ref=name,
            )
        # One pod template serves every node of a multi-node job: select a product only when they share one.
        products = {self._node_product(node) for node in action.node_ids}
        product = products.pop() if len(products) == 1 else None
        body = self._job_body(action, payload, product=product)
        namespace = self.config.namespace
        timeout = self._timeout()
        try:
            self._batch.create_namespaced_job(
                namespace, body, dry_run=self._dry_run(), _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return self._start_conflict(action, name)
            if exc.status in (400, 422):
                return ActionResult(
                    "start", action.job_id, is_ok=False, message=_describe(exc), backend_ref=name
                )
            raise _backend_error(f"create job {name}", exc) from exc
        except (urllib3.exceptions.HTTPError, ValidationError) as exc:
            raise _backend_error(f"create job {name}", exc) from exc
        prefix = "dry run: " if self.config.dry_run else ""
        nodes = ",".join(action.node_ids)
        return ActionResult(
            "start",
            action.job_id,
            is_ok=True,
            message=f"{prefix}created Job {name} on {nodes}",
            backend_ref=name,
        )

    def _start_conflict(self, action: StartAction, name: str) -> ActionResult:
        """A Job of that name exists: success when it is this very start, a failed result otherwise."""
        existing = self._call(
            f"read job {name}",
            lambda: self._batch.read_namespaced_job(
                name, self.config.namespace, _request_timeout=self._timeout()
            ),
        )
        meta = existing.metadata
        annotations = (meta.annotations if meta else None) or {}
        if meta is not None and meta.deletion_timestamp is not None:
            message = f"Job {name} of an earlier attempt is still being deleted; retry"
            return ActionResult("start", action.job_id, is_ok=False, message=message, backend_ref=name)
        if _parse_gpu_ids(annotations.get(GPU_IDS_ANNOTATION)) != action.gpu_ids:
            message = f"Job {name} already exists with GPUs {annotations.get(GPU_IDS_ANNOTATION)!r}"
            return ActionResult("start", action.job_id, is_ok=False, message=message, backend_ref=name)
        if _finished_condition(existing) is not None:
            message = f"Job {name} already exists and has finished; delete it before starting the job again"
            return ActionResult("start", action.job_id, is_ok=False, message=message, backend_ref=name)
        return ActionResult(
            "start", action.job_id, is_ok=True, message=f"Job {name} already exists", backend_ref=name
        )

    def _node_product(self, node: str) -> str | None:
        if node not in self._node_products:
            found = self._call_absent_ok(
                f"read node {node}",
                lambda: self._remember_product(
                    self._core.read_node(node, _request_timeout=self._timeout()), node=node
                ),
            )
            if not found:
                return None
        return self._node_products.get(node)

    def _remember_product(self, item: k8s_client.V1Node, *, node: str) -> None:
        labels = (item.metadata.labels if item.metadata else None) or {}
        product = labels.get(self.config.gpu_product_label)
        if product:
            self._node_products[node] = product

    def _job_body(self, action: StartAction, payload: JobPayload, *, product: str | None) -> k8s_client.V1Job:
        config = self.config
        pod_count = len(action.node_ids)
        gpus_per_pod = len(action.gpu_ids) // pod_count
        label_value = job_label_value(action.job_id)
        labels = {
            **payload.labels,
            JOB_ID_LABEL: label_value,
            MANAGED_BY_LABEL: "berth",
            KIND_LABEL: "preemptible" if action.is_preemptible else payload.kind.value,
        }
        annotations = {
            JOB_ID_ANNOTATION: action.job_id,
            GPU_IDS_ANNOTATION: ",".join(str(gpu) for gpu in action.gpu_ids),
        }
        if action.is_preemptible:
            priority_class = config.priority_classes.preemptible
        elif payload.kind is JobKind.INTERACTIVE:
            priority_class = config.priority_classes.interactive
        else:
            priority_class = config.priority_classes.batch

        limits = {config.gpu_resource: str(gpus_per_pod)}
        container = k8s_client.V1Container(
            name="main",
            image=payload.image,
            command=list(payload.command) or None,
            args=list(payload.args) or None,
            env=[k8s_client.V1EnvVar(name=k, value=v) for k, v in payload.env.items()] or None,
            resources=k8s_client.V1ResourceRequirements(
                limits=limits, requests={**payload.requests, **limits}
            ),
        )
        # matchFields on metadata.name pins to the node object itself; the hostname label can differ from it.
        affinity = k8s_client.V1Affinity(
            node_affinity=k8s_client.V1NodeAffinity(
                required_during_scheduling_ignored_during_execution=k8s_client.V1NodeSelector(
                    node_selector_terms=[
                        k8s_client.V1NodeSelectorTerm(
                            match_fields=[
                                k8s_client.V1NodeSelectorRequirement(
                                    key="metadata.name", operator="In", values=list(action.node_ids)
                                )
                            ]
                        )
                    ]
                )
            )
        )
        if pod_count > 1:
            affinity.pod_anti_affinity = k8s_client.V1PodAntiAffinity(
                required_during_scheduling_ignored_during_execution=[
                    k8s_client.V1PodAffinityTerm(
                        label_selector=k8s_client.V1LabelSelector(match_labels={JOB_ID_LABEL: label_value}),
                        topology_key=HOSTNAME_LABEL,
                    )
                ]
            )
        pod_spec = k8s_client.V1PodSpec(
            containers=[container],
            restart_policy="Never",
            affinity=affinity,
            node_selector={config.gpu_product_label: product} if product else None,
            priority_class_name=priority_class,
            termination_grace_period_seconds=config.termination_grace_s,
            tolerations=[k8s_client.V1Toleration(key=key, operator="Exists") for key in config.tolerations]
            or None,
            service_account_name=payload.service_account,
        )
        return k8s_client.V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=k8s_client.V1ObjectMeta(
                name=job_name(action.job_id),
                namespace=config.namespace,
                labels=labels,
                annotations=annotations,
            ),
            spec=k8s_client.V1JobSpec(
                backoff_limit=0,
                parallelism=pod_count,
                completions=pod_count,
                completion_mode="Indexed" if pod_count > 1 else None,
                active_deadline_seconds=payload.active_deadline_s,
                template=k8s_client.V1PodTemplateSpec(
                    metadata=k8s_client.V1ObjectMeta(labels=labels, annotations=annotations),
                    spec=pod_spec,
                ),
            ),
        )

    # ---- plumbing ----

    def _timeout(self) -> tuple[float, float]:
        return (self.config.timeout_s, self.config.timeout_s)

    def _dry_run(self) -> str | None:
        return "All" if self.config.dry_run else None

    def _list_all(self, doing: str, fetch: Callable[[str | None], _Page[_I]]) -> list[_I]:
        """All items of a list call, page by page (as kubectl does), so a big cluster is never one answer."""
        items: list[_I] = []
        token: str | None = None
        for _ in range(_MAX_PAGES):
            page = self._call(doing, functools.partial(fetch, token))
            items.extend(page.items)
            token = page.metadata.var_continue if page.metadata else None
            if not token:
                return items
        raise BackendError(f"Kubernetes API: {doing} did not end after {_MAX_PAGES} pages")

    def _call(self, doing: str, call: Callable[[], _T]) -> _T:
        """Run one API call; every failure becomes `BackendError`."""
        try:
            return call()
        except ApiException as exc:
            raise _backend_error(doing, exc) from exc
        except (urllib3.exceptions.HTTPError, ValidationError) as exc:
            raise _backend_error(doing, exc) from exc

    def _call_absent_ok(self, doing: str, call: Callable[[], object]) -> bool:
        """Run one API call where 404 means "already done"; return whether the object was there."""
        try:
            call()
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise _backend_error(doing, exc) from exc
        except (urllib3.exceptions.HTTPError, ValidationError) as exc:
            raise _backend_error(doing, exc) from exc
        return True


# ---- helpers (pure) ----


def _client_configuration(config: KubernetesConfig) -> k8s_client.Configuration:
    configuration = k8s_client.Configuration()
    try:
        if config.host:
            configuration.host = config.host.rstrip("/")
            if config.token:
                configuration.api_key = {"BearerToken": config.token}
                configuration.api_key_prefix = {"BearerToken": "Bearer"}
            configuration.verify_ssl = config.verify_ssl
            configuration.ssl_ca_cert = config.ca_cert
        elif config.in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=config.kubeconfig,
                context=config.context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (ConfigException, OSError) as exc:
        raise BackendError(f"Kubernetes configuration: {exc}") from exc
    # No client-side retries: a refused connection fails at once and the calling task retries the round.
    configuration.retries = 0
    return configuration


def _natural_key(name: str) -> list[tuple[int, int | str]]:
    """Sort key putting gpu-2 before gpu-10 (the order the Slurm backend numbers nodes in, too)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part]


def _gpu_count(quantity: str | None) -> int:
    # Extended resources such as nvidia.com/gpu are whole numbers; anything else counts as no GPU.
    try:
        return max(0, int(quantity)) if quantity is not None else 0
    except ValueError:
        return 0


def _parse_gpu_ids(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        return ()


def _object_job_id(meta: k8s_client.V1ObjectMeta | None) -> str | None:
    """The Berth job id of an object: the exact annotation, else the label (ids that are label values)."""
    if meta is None:
        return None
    annotations = meta.annotations or {}
    labels = meta.labels or {}
    if JOB_ID_ANNOTATION in annotations:
        return annotations[JOB_ID_ANNOTATION]
    return labels.get(JOB_ID_LABEL)


def _epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _finished_condition(job: k8s_client.V1Job) -> k8s_client.V1JobCondition | None:
    conditions = (job.status.conditions if job.status else None) or []
    return next((c for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"), None)


def _owner_uid(pod: k8s_client.V1Pod) -> str | None:
    """The uid of the Job that owns a pod, None when the pod names no owning Job."""
    owners = (pod.metadata.owner_references if pod.metadata else None) or []
    return next((o.uid for o in owners if o.kind == "Job"), None)


def _is_scheduler_preempted(pod: k8s_client.V1Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "DisruptionTarget" and c.reason == "PreemptionByScheduler" for c in conditions)


def _observed_jobs(
    jobs: Iterable[k8s_client.V1Job], pods: Iterable[k8s_client.V1Pod]
) -> tuple[ObservedJob, ...]:
    """Map Berth's Jobs and pods to one `ObservedJob` per Berth job id, sorted by id."""
    jobs_by_id: dict[str, k8s_client.V1Job] = {}
    for job in jobs:
        job_id = _object_job_id(job.metadata)
        if job_id is not None:  # the emulator ignores label selectors; a real server never sends these
            jobs_by_id[job_id] = job
    pods_by_id: dict[str, list[k8s_client.V1Pod]] = {}
    for pod in pods:
        job_id = _object_job_id(pod.metadata)
        if job_id is not None:
            pods_by_id.setdefault(job_id, []).append(pod)
    observed = [
        _observe(job_id, jobs_by_id.get(job_id), pods_by_id.get(job_id, []))
        for job_id in sorted(jobs_by_id.keys() | pods_by_id.keys())
    ]
    return tuple(observed)


def _observe(job_id: str, job: k8s_client.V1Job | None, pods: list[k8s_client.V1Pod]) -> ObservedJob:
    meta = job.metadata if job is not None else (pods[0].metadata if pods else None)
    annotations = (meta.annotations if meta else None) or {}
    gpu_ids = _parse_gpu_ids(annotations.get(GPU_IDS_ANNOTATION))
    ref = (meta.name if meta else None) or ""
    earlier: list[k8s_client.V1Pod] = []
    if job is not None:
        ref = (job.metadata.name if job.metadata else None) or ref
        # A requeued job gets a new Job of the same name while the pods of the preempted attempt may still be
        # in their grace period: only pods owned by this Job (by uid) describe it.
        uid = job.metadata.uid if job.metadata else None
        earlier = [p for p in pods if _owner_uid(p) not in (None, uid)]
        pods = [p for p in pods if p not in earlier]
    started = [t for t in (_epoch(p.status.start_time if p.status else None) for p in pods) if t is not None]
    job_started = _epoch(job.status.start_time if job is not None and job.status else None)
    started_at = min(started) if started else job_started

    terminating = [p for p in pods if p.metadata and p.metadata.deletion_timestamp is not None]
    is_job_deleting = job is None or (
        job.metadata is not None and job.metadata.deletion_timestamp is not None
    )
    if terminating and is_job_deleting:
        reasons = {
            ((p.metadata.annotations if p.metadata else None) or {}).get(STOP_REASON_ANNOTATION) for p in pods
        }
        state = ObservedState.PREEMPTED if "preempted" in reasons else ObservedState.CANCELLED
        message = "terminating" if reasons - {None} else "terminating; deleted outside Berth"
        return ObservedJob(job_id, state, gpu_ids, started_at=started_at, backend_ref=ref, message=message)

    if job is not None:
        finished = _finished_condition(job)
        if finished is not None:
            ended_at = _epoch(job.status.completion_time if job.status else None)
            ended_at = ended_at if ended_at is not None else _epoch(finished.last_transition_time)
            if finished.type == "Complete":
                state = ObservedState.COMPLETED
            elif any(_is_scheduler_preempted(p) for p in pods):
                state = ObservedState.PREEMPTED
            else:
                state = ObservedState.FAILED
            message = ": ".join(part for part in (finished.reason, finished.message) if part)
            return ObservedJob(
                job_id,
                state,
                gpu_ids,
                started_at=started_at,
                ended_at=ended_at,
                backend_ref=ref,
                message=message,
            )

    phases = {(p.status.phase if p.status else None) for p in pods}
    if "Running" in phases:
        state = ObservedState.RUNNING
    elif "Unknown" in phases:
        state = ObservedState.LOST
    elif job is None and phases & {"Succeeded", "Failed"}:
        # Pods outlived their Job (orphaned): report what the pods say.
        state = ObservedState.COMPLETED if phases == {"Succeeded"} else ObservedState.FAILED
    else:
        state = ObservedState.PENDING
    message = _waiting_reason(pods) if state is ObservedState.PENDING else ""
    if earlier:
        message = "; ".join(
            filter(None, (message, f"{len(earlier)} pod(s) of an earlier attempt still exist"))
        )
    return ObservedJob(job_id, state, gpu_ids, started_at=started_at, backend_ref=ref, message=message)


def _waiting_reason(pods: list[k8s_client.V1Pod]) -> str:
    """Why a pending pod waits (image pull back-off, unschedulable), for the "why pending" page."""
    for pod in pods:
        status = pod.status
        if status is None:
            continue
        for container in status.container_statuses or []:
            waiting = container.state.waiting if container.state else None
            if waiting is not None and waiting.reason:
                return ": ".join(part for part in (waiting.reason, waiting.message) if part)
        for condition in status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                return ": ".join(part for part in (condition.reason, condition.message) if part)
    return ""


def _no_reservation(action: ReserveAction) -> ActionResult:
    return ActionResult(
        "reserve",
        action.holder_id,
        is_ok=True,
        message="Kubernetes has no reservations; the engine holds these GPUs until the booking starts",
    )


def _no_release(action: ReleaseAction) -> ActionResult:
    return ActionResult(
        "release",
        action.holder_id,
        is_ok=True,
        message="Kubernetes has no reservations; the engine released these GPUs",
    )


def _describe(exc: ApiException) -> str:
    """The API server's own message from a Status body, else the HTTP reason."""
    detail = str(exc.reason or "")
    try:
        status = json.loads(exc.body or "")
    except (TypeError, ValueError):
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        detail = status["message"]
    return f"HTTP {exc.status}: {detail}"


def _backend_error(doing: str, exc: Exception) -> BackendError:
    if isinstance(exc, ApiException):
        return BackendError(f"Kubernetes API: {doing} failed: {_describe(exc)}")
    if isinstance(exc, ValidationError):
        # The v37 client validates every response against the API schema; a proxy or an incompatible
        # server version can send a shape it refuses.
        return BackendError(f"Kubernetes API: {doing} returned an unexpected object: {exc}")
    return BackendError(f"Kubernetes API: {doing} failed: {type(exc).__name__}: {exc}")


__all__ = [
    "GPU_IDS_ANNOTATION",
    "JOB_ID_ANNOTATION",
    "JOB_ID_LABEL",
    "STOP_REASON_ANNOTATION",
    "JobPayload",
    "KubernetesBackend",
    "KubernetesConfig",
    "PayloadSource",
    "PriorityClasses",
    "job_label_value",
    "job_name",
]
