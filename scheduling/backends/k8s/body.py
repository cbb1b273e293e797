"""The batch/v1 Job Berth creates for a `StartAction` (pure: no API call)."""

from __future__ import annotations

from kubernetes import client as k8s_client

from scheduling.backends.k8s.config import (
    GPU_IDS_ANNOTATION,
    HOSTNAME_LABEL,
    JOB_ID_ANNOTATION,
    JOB_ID_LABEL,
    KIND_LABEL,
    MANAGED_BY_LABEL,
    JobPayload,
    KubernetesConfig,
    job_label_value,
    job_name,
)
from scheduling.engine.types import JobKind, StartAction


def job_body(
    config: KubernetesConfig, action: StartAction, payload: JobPayload, *, product: str | None
) -> k8s_client.V1Job:
    """The batch/v1 Job for a start (see "Jobs, labels and annotations" in the package docstring).

    One pod per planned node (an Indexed Job when there are several), each with
    ``len(gpu_ids) / len(node_ids)`` GPUs; the caller checked that they split evenly.
    """
    pod_count = len(action.node_ids)
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
    pod_spec = _pod_spec(config, action, payload, product=product, label_value=label_value)
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


def _priority_class(config: KubernetesConfig, action: StartAction, payload: JobPayload) -> str:
    if action.is_preemptible:
        return config.priority_classes.preemptible
    if payload.kind is JobKind.INTERACTIVE:
        return config.priority_classes.interactive
    return config.priority_classes.batch


def _container(config: KubernetesConfig, payload: JobPayload, *, gpus_per_pod: int) -> k8s_client.V1Container:
    limits = {config.gpu_resource: str(gpus_per_pod)}
    return k8s_client.V1Container(
        name="main",
        image=payload.image,
        command=list(payload.command) or None,
        args=list(payload.args) or None,
        env=[k8s_client.V1EnvVar(name=k, value=v) for k, v in payload.env.items()] or None,
        resources=k8s_client.V1ResourceRequirements(limits=limits, requests={**payload.requests, **limits}),
    )


def _affinity(action: StartAction, *, label_value: str) -> k8s_client.V1Affinity:
    """Pinned to the planned nodes; one pod per node when there are several."""
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
    if len(action.node_ids) > 1:
        affinity.pod_anti_affinity = k8s_client.V1PodAntiAffinity(
            required_during_scheduling_ignored_during_execution=[
                k8s_client.V1PodAffinityTerm(
                    label_selector=k8s_client.V1LabelSelector(match_labels={JOB_ID_LABEL: label_value}),
                    topology_key=HOSTNAME_LABEL,
                )
            ]
        )
    return affinity


def _pod_spec(
    config: KubernetesConfig,
    action: StartAction,
    payload: JobPayload,
    *,
    product: str | None,
    label_value: str,
) -> k8s_client.V1PodSpec:
    gpus_per_pod = len(action.gpu_ids) // len(action.node_ids)
    return k8s_client.V1PodSpec(
        containers=[_container(config, payload, gpus_per_pod=gpus_per_pod)],
        restart_policy="Never",
        affinity=_affinity(action, label_value=label_value),
        node_selector={config.gpu_product_label: product} if product else None,
        priority_class_name=_priority_class(config, action, payload),
        termination_grace_period_seconds=config.termination_grace_s,
        tolerations=[k8s_client.V1Toleration(key=key, operator="Exists") for key in config.tolerations]
        or None,
        service_account_name=payload.service_account,
    )
