"""How the Kubernetes and Kueue connectors reach an API server: one ``ApiClient``.

Out of the cluster (a platform team's laptop, the tests): a kubeconfig file and optionally
one of its contexts. In the cluster (the connector's Deployment, deploy/kubernetes/): the
Pod's ServiceAccount token and CA, which ``load_incluster_config`` reads and re-reads as
the kubelet rotates the token. The connector never logs the credentials it was given.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.config.config_exception import ConfigException

from connectors.base import ConnectorError


def api_client(*, kubeconfig: Path | None = None, context: str | None = None) -> client.ApiClient:
    """An API client from ``kubeconfig`` (and ``context``), or in-cluster when none is given.

    Raises a non-retryable :class:`ConnectorError` when neither is usable: retrying cannot
    make a missing file or ServiceAccount appear.
    """
    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            kube_config.load_kube_config(
                config_file=str(kubeconfig),
                context=context,
                client_configuration=configuration,
            )
        else:
            kube_config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError) as error:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster ServiceAccount"
        raise ConnectorError(f"cannot load {where}: {error}", retryable=False) from error
    # The connector retries on its own terms (the runner's backoff, a watch's re-list);
    # urllib3's silent retries would only hide a flapping API server.
    configuration.retries = False
    api = client.ApiClient(configuration)
    api.user_agent = "shaper-connector"
    return api
