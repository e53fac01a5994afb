"""An API client for the cluster Vigil runs in, or the one a kubeconfig names.

Transient failures (429 with Retry-After, 5xx, dropped connections, timeouts) are retried by
urllib3 under the client, with backoff, for every verb: Vigil's writes are safe to repeat (node
writes carry a resourceVersion, Events have deterministic names). 409 is not retried here: it means
the node changed, and the actuator re-reads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config
from urllib3.util.retry import Retry

RETRY = Retry(
    total=5,
    connect=3,
    read=2,
    status=5,
    backoff_factor=0.2,
    status_forcelist=(429, 500, 502, 503, 504),
    allowed_methods=None,  # all verbs, PATCH and POST included
    respect_retry_after_header=True,
    raise_on_status=False,  # the last answer reaches the client, which raises ApiException with its status
)


class KubeConfigError(ValueError):
    pass


def api_client(kubeconfig: Path | None = None, context: str | None = None, retry: Retry = RETRY) -> client.ApiClient:
    """In-cluster service-account credentials when running in a pod, else the kubeconfig."""
    configuration = client.Configuration()
    try:
        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (config.ConfigException, OSError) as exc:
        where = str(kubeconfig) if kubeconfig else "in-cluster or ~/.kube/config"
        raise KubeConfigError(f"no usable Kubernetes credentials ({where}): {exc}") from None
    configuration.retries = retry
    return client.ApiClient(configuration)
