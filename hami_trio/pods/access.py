"""How to reach the API server and which node this is: pure values, no Kubernetes client.

:class:`KubeAccess` chooses between a kubeconfig and the pod's service account like
``kubectl`` in a pod would; :func:`validate_node_name` keeps the pod watch's field selector
well formed.  The client itself is opened in :mod:`hami_trio.pods.watch`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from hami_trio.errors import ConfigError, PodSourceError

__all__ = [
    "KUBECONFIG_ENV",
    "NODE_NAME_ENV",
    "SERVICE_ACCOUNT_DIR",
    "SERVICE_HOST_ENV",
    "SERVICE_PORT_ENV",
    "KubeAccess",
    "validate_node_name",
]

#: The node this agent runs on (downward API ``spec.nodeName``).
NODE_NAME_ENV: Final = "NODE_NAME"
#: A kubeconfig path (or ``:``-separated list); when set it wins over the in-cluster config.
KUBECONFIG_ENV: Final = "KUBECONFIG"
#: Where Kubernetes mounts the service account token and CA into a pod.
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_HOST_ENV: Final = "KUBERNETES_SERVICE_HOST"
SERVICE_PORT_ENV: Final = "KUBERNETES_SERVICE_PORT"

# A node name is a DNS-1123 subdomain.  Checking it keeps the field selector well formed
# ("," or "=" in the value would change its meaning).
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def validate_node_name(name: str, *, source: str = NODE_NAME_ENV) -> str:
    """Check that ``name`` is a Kubernetes node name (a DNS-1123 subdomain).

    Args:
        name: the value to check.
        source: the flag or variable it came from, for the error message.

    Returns:
        ``name`` unchanged.

    Raises:
        ConfigError: empty, longer than 253 characters, or not a DNS-1123 subdomain.
    """
    if not name:
        raise ConfigError(
            f"{source} is empty; it must name this node when Kubernetes is used "
            "(set it from the downward API spec.nodeName, or pass --no-kubernetes)"
        )
    if len(name) > 253 or _NODE_NAME.fullmatch(name) is None:
        raise ConfigError(f"{source}: {name!r} is not a valid Kubernetes node name")
    return name


@dataclass(frozen=True, slots=True)
class KubeAccess:
    """How to reach the API server: a kubeconfig, or the pod's service account.

    Build it with :meth:`from_env`; the loading itself happens in :func:`serve_pod_watch`.
    """

    kubeconfig: str | None = None
    service_host: str = ""
    service_port: str = ""
    token_path: str = f"{SERVICE_ACCOUNT_DIR}/token"
    ca_path: str = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
    context: str | None = None

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        kubeconfig: str | None = None,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
    ) -> KubeAccess:
        """Choose the configuration like ``kubectl`` in a pod would.

        An explicit ``kubeconfig`` argument wins, then ``$KUBECONFIG``, then the in-cluster
        configuration (``$KUBERNETES_SERVICE_HOST``/``PORT`` plus the service account token
        and CA under ``service_account_dir``).

        Raises:
            PodSourceError: none of them is available.
        """
        path = kubeconfig or env.get(KUBECONFIG_ENV)
        if path:
            return cls(kubeconfig=path)
        host = env.get(SERVICE_HOST_ENV, "")
        port = env.get(SERVICE_PORT_ENV, "")
        if host and port:
            return cls(
                service_host=host,
                service_port=port,
                token_path=f"{service_account_dir}/token",
                ca_path=f"{service_account_dir}/ca.crt",
            )
        raise PodSourceError(
            "no Kubernetes API configuration: set KUBECONFIG, run in a pod with a service "
            f"account ({SERVICE_HOST_ENV}/{SERVICE_PORT_ENV} set), or pass --no-kubernetes"
        )

    def describe(self) -> str:
        """A short description for log lines (never the token)."""
        if self.kubeconfig is not None:
            return f"kubeconfig {self.kubeconfig}"
        return f"in-cluster https://{self.service_host}:{self.service_port}"
