"""How the agent reaches the API server and names its node (hami_trio.pods.access)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_trio.errors import ConfigError, PodSourceError
from hami_trio.pods.access import KubeAccess, validate_node_name


@pytest.mark.parametrize("name", ["node-a", "ip-10-0-0-1.ec2.internal", "a"])
def test_valid_node_names(name: str) -> None:
    assert validate_node_name(name) == name


@pytest.mark.parametrize("name", ["", "Node-A", "a,b", "a=b", "-a", "a" * 254, "a..b"])
def test_invalid_node_names(name: str) -> None:
    with pytest.raises(ConfigError, match="NODE_NAME"):
        validate_node_name(name)


def test_node_name_is_required() -> None:
    with pytest.raises(ConfigError, match="--no-kubernetes"):
        validate_node_name("")


def test_kube_access_from_env(tmp_path: Path) -> None:
    assert KubeAccess.from_env({"KUBECONFIG": "/k"}).kubeconfig == "/k"
    assert KubeAccess.from_env({"KUBECONFIG": "/k"}, kubeconfig="/x").kubeconfig == "/x"
    incluster = KubeAccess.from_env(
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
        service_account_dir=str(tmp_path),
    )
    assert incluster.kubeconfig is None
    assert incluster.token_path == f"{tmp_path}/token"
    assert incluster.ca_path == f"{tmp_path}/ca.crt"
    assert incluster.describe() == "in-cluster https://10.0.0.1:443"
    # KUBECONFIG wins over the in-cluster variables, like kubectl.
    both = {"KUBECONFIG": "/k", "KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}
    assert KubeAccess.from_env(both).kubeconfig == "/k"
    with pytest.raises(PodSourceError, match="KUBECONFIG"):
        KubeAccess.from_env({"KUBERNETES_SERVICE_HOST": "h"})
