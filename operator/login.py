"""kopf's credentials, from the same client configuration as the operator's own calls.

kopf registers its default login handlers only in its global registry; the operator's
handlers live in a private one (`build_registry`), so without this handler kopf has no
credentials at all. Called at start and again whenever the API server answers 401, so a
rotated service-account token is picked up.
"""

from __future__ import annotations

from typing import Any

import kopf

from tandem.engine.api.kube_config import load_configuration


def connection_info(configuration: Any) -> kopf.ConnectionInfo:
    """A `kubernetes.client.Configuration` as kopf's credentials: bearer token (read now,
    through the client's refresh hook), client certificate, or basic auth."""
    header = configuration.get_api_key_with_prefix("BearerToken")
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def login(**_: Any) -> kopf.ConnectionInfo:
    """The kopf login handler: in-cluster service account, else $KUBECONFIG."""
    return connection_info(load_configuration())
