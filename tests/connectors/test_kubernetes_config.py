"""The Kubernetes connector's settings refuse what would leak or cannot work, naming the
field: the node agents' URL (``node_agent_url``) carries their Bearer token with every call,
so it must be HTTPS unless the agent is on this host."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from connectors.kubernetes.config import KubernetesConnectorConfig


@pytest.mark.parametrize(
    "url", ["https://{node}:8470", "https://agents.example:8470", "http://127.0.0.1:8470"]
)
def test_the_agents_url_is_https_or_on_this_host(url: str) -> None:
    config = KubernetesConnectorConfig(cluster="c", node_agent_url=url)
    assert config.node_agent_url == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://{node}:8470", "must be https://"),
        ("http://10.0.0.5:8470", "must be https://"),
        ("ftp://{node}:8470", "http:// or https://"),
        ("https://{host}:8470", "{node}"),
    ],
)
def test_other_agent_urls_are_refused_by_their_field(url: str, says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        KubernetesConnectorConfig(cluster="c", node_agent_url=url)
    (error,) = refused.value.errors()
    assert error["loc"] == ("node_agent_url",)
    assert says in error["msg"]
