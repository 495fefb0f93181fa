"""Turn Kueue's release manifests into what a Kueue run as a local process needs.

    python3 kueue-manifests.py IN.yaml OUT.yaml WEBHOOK_PORT

Kueue's release (``kubectl kustomize config/default``) runs the manager as a Deployment
behind a Service. Here the manager is a process on this host, listening on 127.0.0.1:PORT,
so:

* the Deployment, the manager ConfigMap, the metrics and visibility Services and the
  visibility APIServices are left out (the manager gets its configuration from a file);
* ``kueue-webhook-service`` becomes an ExternalName Service for ``localhost``: the API
  server resolves a webhook's service through its cluster-IP resolver, which for an
  ExternalName Service dials ``<externalName>:<the webhook's port>`` while still checking
  the TLS certificate against ``kueue-webhook-service.kueue-system.svc``, the name in the
  certificate that Kueue's own certificate management issues and injects;
* every webhook and CRD conversion webhook that points at that Service gets PORT as its port.

Everything else (namespace, CRDs, RBAC, webhook configurations, the empty certificate
Secret) is applied as released.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

WEBHOOK_SERVICE = "kueue-webhook-service"
DROP_KINDS = {"Deployment", "APIService", "ConfigMap"}


def _point_at_port(client_config: dict[str, Any], port: int) -> None:
    service = client_config.get("service")
    if service and service.get("name") == WEBHOOK_SERVICE:
        service["port"] = port


def transform(documents: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    out = []
    for doc in documents:
        if not doc:
            continue
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in DROP_KINDS:
            continue
        if kind == "Service":
            if name != WEBHOOK_SERVICE:
                continue
            doc["spec"] = {
                "type": "ExternalName",
                "externalName": "localhost",
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            }
        elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for webhook in doc.get("webhooks", []):
                _point_at_port(webhook["clientConfig"], port)
        elif kind == "CustomResourceDefinition":
            webhook = (doc["spec"].get("conversion") or {}).get("webhook")
            if webhook:
                _point_at_port(webhook["clientConfig"], port)
        out.append(doc)
    return out


def main() -> None:
    source, target, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(source, encoding="utf-8") as stream:
        documents = list(yaml.safe_load_all(stream))
    kept = transform(documents, port)
    if not any(d["kind"] == "Service" for d in kept):
        sys.exit(f"{source} has no Service {WEBHOOK_SERVICE}: not Kueue's release manifests?")
    with open(target, "w", encoding="utf-8") as stream:
        yaml.safe_dump_all(kept, stream, sort_keys=False)


if __name__ == "__main__":
    main()
