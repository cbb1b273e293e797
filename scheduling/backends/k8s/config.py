"""Kubernetes backend configuration, job payloads, and the names and labels of Berth's objects."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduling.engine.types import (
    JobKind,
)

JOB_ID_LABEL = "berth.dev/job-id"
KIND_LABEL = "berth.dev/kind"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
JOB_ID_ANNOTATION = "berth.dev/job-id"
GPU_IDS_ANNOTATION = "berth.dev/gpu-ids"
STOP_REASON_ANNOTATION = "berth.dev/stop-reason"
HOSTNAME_LABEL = "kubernetes.io/hostname"


# A label value: up to 63 alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric.
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class PriorityClasses:
    """Names of the PriorityClass objects for each class of Berth work (created by the cluster admin)."""

    interactive: str = "berth-interactive"
    batch: str = "berth-batch"
    preemptible: str = "berth-preemptible"


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    """How to reach the cluster and how Berth's objects look in it; see the package docstring."""

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
