"""An API client for the cluster Vigil runs in, or the one a kubeconfig names.

Transient failures (429 with Retry-After, 5xx, dropped connections, timeouts) are retried by
urllib3 under the client, with backoff, for every verb: Vigil's writes are safe to repeat (node
writes carry a resourceVersion, Events have deterministic names). 409 is not retried here: it means
the node changed, and the actuator re-reads it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
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


REFRESH_EVERY_S = 10.0


def _at_most_every(
    seconds: float, hook: Callable[[client.Configuration], None]
) -> Callable[[client.Configuration], None]:
    last = [float("-inf")]
    lock = threading.Lock()

    def throttled(configuration: client.Configuration) -> None:
        with lock:
            if time.monotonic() - last[0] < seconds:
                return
            last[0] = time.monotonic()
        hook(configuration)
        configuration.refresh_api_key_hook = throttled  # type: ignore[assignment]  # the loader puts its own back

    return throttled


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
    if (hook := configuration.refresh_api_key_hook) is not None:
        # A kubeconfig's credentials are loaded again before every request (0.5 ms each: the loader
        # re-reads the proxy environment); a token that expires is seen within REFRESH_EVERY_S.
        configuration.refresh_api_key_hook = _at_most_every(REFRESH_EVERY_S, hook)
    # As many kept connections as the action runner has threads (a burst's writes at once), plus the
    # node watch: past the pool, each request opens and closes a connection of its own.
    configuration.connection_pool_maxsize = 40
    return client.ApiClient(configuration)
