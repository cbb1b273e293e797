"""The Kubernetes API client: configuration, paging, and every failure as `BackendError`."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from pydantic import ValidationError

from scheduling.backends.base import (
    BackendError,
)
from scheduling.backends.k8s.config import KubernetesConfig, PayloadSource
from scheduling.backends.k8s.observe import _backend_error

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


class KubernetesClient:
    """The official client for one cluster, with Berth's timeouts, paging and error mapping."""

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
