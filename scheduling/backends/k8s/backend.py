"""`KubernetesBackend`: the `ClusterBackend` that carries out a plan on Kubernetes (package docstring)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from scheduling.backends.base import (
    ActionResult,
    JobOutput,
    ObservedCluster,
    natural_key,
    tail,
)
from scheduling.backends.k8s.body import job_body
from scheduling.backends.k8s.client import _PAGE_SIZE, KubernetesClient
from scheduling.backends.k8s.config import (
    GPU_IDS_ANNOTATION,
    JOB_ID_LABEL,
    STOP_REASON_ANNOTATION,
    JobPayload,
    job_label_value,
    job_name,
)
from scheduling.backends.k8s.observe import (
    _backend_error,
    _describe,
    _epoch,
    _finished_condition,
    _gpu_count,
    _no_release,
    _no_reservation,
    _object_job_id,
    _observed_jobs,
    _parse_gpu_ids,
)
from scheduling.engine.types import (
    Node,
    NodeStatus,
    Plan,
    PreemptAction,
    StartAction,
)

# Taints the node lifecycle controller sets on a node that stopped reporting: the node is down, not draining.
_DOWN_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


class KubernetesBackend(KubernetesClient):
    """`ClusterBackend` for one Kubernetes cluster (one namespace holds Berth's Jobs)."""

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
        gpu_nodes.sort(key=lambda entry: natural_key(entry[0]))

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
        `BackendError` when the API cannot be reached or refuses Berth as a whole (see the package docstring);
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
        pods = self._job_pods(job_id)
        # The Job goes first: were a pod deleted while its Job lives, the Job controller could count it
        # as a failure or replace it.  Its pods then get the planned grace themselves (package docstring).
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
        pods = self._job_pods(job_id)
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

    def _job_pods(self, job_id: str) -> k8s_client.V1PodList:
        """The pods labelled with the job's id (callers re-check the exact id: labels may be hashes)."""
        return self._call(
            "list pods",
            lambda: self._core.list_namespaced_pod(
                self.config.namespace,
                label_selector=f"{JOB_ID_LABEL}={job_label_value(job_id)}",
                _request_timeout=self._timeout(),
            ),
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
        body = job_body(self.config, action, payload, product=product)
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
