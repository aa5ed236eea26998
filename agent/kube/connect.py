"""Finding the cluster and building the client (the only place that loads
``kubernetes`` config code).

Order: ``--kubeconfig``, then ``kubernetes.kubeconfig`` in the config file,
then ``$KUBECONFIG``, then the pod's service account (in-cluster). None of
them: no cluster, and the agent runs as a dry run.

In-cluster, the client re-reads the bound service-account token at most once
a minute (kubernetes-client ``incluster_config.py``, since 12.0.0); the
kubelet rotates it at 80 % of its lifetime, and `reauth` re-reads it at once
after a 401.

Memory: the client is loaded lean (`lean`). ``import kubernetes`` runs a
package ``__init__`` that imports every part of the library (dynamic,
stream, informer, leaderelection, utils), and ``kubernetes.config`` imports
the kubeconfig loader (oauthlib, requests) even in-cluster. the agent imports
only the submodules the agent uses; the packages stay usable by anyone else
in the process (the first other attribute read runs their own ``__init__``).
What each part costs: benches/README.md, "RSS of agent run".
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..schema import ConfigError

log = logging.getLogger(__name__)

TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
REAUTH_MIN_INTERVAL = 5.0


@dataclass(frozen=True, slots=True)
class ClusterSource:
    kind: str  # "kubeconfig" | "in-cluster"
    path: str | None = None  # kubeconfig file (None: $KUBECONFIG, possibly a list)
    token_file: str = TOKEN_FILE
    ca_file: str = CA_FILE

    def describe(self) -> str:
        return f"kubeconfig {self.path or os.environ.get('KUBECONFIG', '')}" if self.kind == "kubeconfig" else "in-cluster service account"


def find_cluster(flag: str | None, configured: str, environ: Mapping[str, str] = os.environ) -> ClusterSource | None:
    if flag:
        return ClusterSource("kubeconfig", flag)
    if configured:
        return ClusterSource("kubeconfig", configured)
    if environ.get("KUBECONFIG"):
        return ClusterSource("kubeconfig", None)
    if environ.get("KUBERNETES_SERVICE_HOST") and environ.get("KUBERNETES_SERVICE_PORT"):
        return ClusterSource("in-cluster")
    return None


LEAN_PACKAGES = ("kubernetes", "kubernetes.config", "kubernetes.utils")


def lean() -> None:
    """Before the first import of ``kubernetes``: its packages of `LEAN_PACKAGES` are registered without
    running their ``__init__``, so that importing a submodule loads that submodule and what it imports,
    no more. A package's first attribute read that is not a loaded submodule runs its real ``__init__``
    (then it is exactly what ``import`` gives). Already imported (the tests, another user): as is."""
    if "kubernetes" not in sys.modules:  # parents first
        for pkg in LEAN_PACKAGES:
            _register_lean(pkg)


def _register_lean(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"no package {name}", name=name)
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def complete(attr: str) -> Any:
        del module.__getattr__
        loader.exec_module(module)  # the package's own __init__, once
        return getattr(module, attr)

    module.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def build_client(source: ClusterSource) -> tuple[Any, Callable[[], None]]:
    """The ApiClient (urllib3 retries off) and a function that re-reads the credentials."""
    lean()
    from kubernetes.client.api_client import ApiClient
    from kubernetes.client.configuration import Configuration

    cfg = Configuration()
    load = _loader(source, cfg)
    try:
        load()
    except Exception as exc:  # ConfigException, OSError, YAML errors: all one line
        key = "--kubeconfig" if source.kind == "kubeconfig" else "in-cluster config"
        text = " ".join(str(exc).split())  # YAML errors span lines
        raise ConfigError(source.path or key, None, f"cannot load the cluster credentials: {text}") from None
    # One retry policy, the agent's (see api.py): urllib3 must not retry on its own.
    cfg.retries = False
    api = ApiClient(cfg)
    api.user_agent = f"node-health-agent/{__version__}"
    last = [float("-inf")]

    def reauth() -> None:
        if time.monotonic() - last[0] < REAUTH_MIN_INTERVAL:
            return
        last[0] = time.monotonic()
        try:
            load()
            cfg.retries = False
            log.info("re-read the cluster credentials after 401 Unauthorized")
        except Exception as exc:  # keep the old ones; the next 401 tries again
            log.error("re-reading the cluster credentials failed: %s", exc)

    return api, reauth


def _loader(source: ClusterSource, cfg: Any) -> Callable[[], None]:
    if source.kind == "kubeconfig":
        from kubernetes.config.kube_config import load_kube_config

        return lambda: load_kube_config(  # type: ignore[no-untyped-call]
            config_file=source.path, client_configuration=cfg, persist_config=False
        )
    from kubernetes.config.incluster_config import InClusterConfigLoader

    loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=source.token_file, cert_filename=source.ca_file
    )
    return lambda: loader.load_and_set(cfg)  # type: ignore[no-untyped-call]
