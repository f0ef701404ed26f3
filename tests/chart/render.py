"""Render charts/device-numa-extender with the real Helm SDK (helm-python-sdk).

Shared by the tests and by `tests/chart/run.sh --regenerate`, which writes
deploy/device-numa-extender.yaml (the chart rendered with default values).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "device-numa-extender"
DEPLOY_FILE = ROOT / "deploy" / "device-numa-extender.yaml"
RELEASE = "device-numa-extender"
NAMESPACE = "device-numa-system"

# Helm's install order (pkg/release/util/kind_sorter.go), trimmed to kinds the chart can emit.
KIND_ORDER = [
    "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
    "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass",
    "PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole",
    "ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList",
    "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod", "ReplicationController",
    "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
    "IngressClass", "Ingress", "APIService",
]

HEADER = f"""\
# GENERATED FILE - do not edit. It is charts/device-numa-extender rendered with default values
# (mode: scheduler), release "{RELEASE}", namespace "{NAMESPACE}".
# Regenerate: tests/chart/run.sh --regenerate   (a chart test fails while it is stale)
# Install:    kubectl create namespace {NAMESPACE}
#             kubectl apply -f deploy/crds/   # unless koordinator / an NRT exporter installed them
#             kubectl apply -f deploy/device-numa-extender.yaml
"""

_DOC_SPLIT = re.compile(r"^---[ \t]*$", re.MULTILINE)


def load_chart() -> helm.Chart:
    return helm.Chart.load(CHART_DIR)


def render(values: dict[str, Any] | None = None, *, name: str = RELEASE,
           namespace: str = NAMESPACE, chart: helm.Chart | None = None) -> dict[str, str]:
    """Template path -> rendered text, exactly as Helm renders it (offline, install action)."""
    own = chart is None
    chart = chart or load_chart()
    try:
        return chart.render(values, name=name, namespace=namespace, is_install=True)
    finally:
        if own:
            chart.close()


def documents(rendered: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(template path, document text, parsed object) for every non-empty manifest, in Helm's
    install order (kind, then name) so the output is stable."""
    docs = []
    for path, text in rendered.items():
        if path.endswith("NOTES.txt") or "/templates/" not in path:
            continue
        for part in _DOC_SPLIT.split(text):
            obj = yaml.safe_load(part)
            if obj is None:
                continue
            docs.append((path, part.strip("\n") + "\n", obj))

    def key(d):
        kind = d[2].get("kind", "")
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        return (rank, kind, d[2]["metadata"].get("name", ""), d[0])

    return sorted(docs, key=key)


def notes(rendered: dict[str, str]) -> str:
    return next(v for k, v in rendered.items() if k.endswith("NOTES.txt"))


def deploy_manifest(values: dict[str, Any] | None = None) -> str:
    """The content deploy/device-numa-extender.yaml must have (default values), or the same
    manifest rendered with other values."""
    parts = [HEADER] if values is None else []
    for path, text, _ in documents(render(values)):
        parts.append(f"---\n# Source: {path}\n{text}")
    return "".join(parts)


def main(argv: list[str]) -> int:
    if argv[1:] == ["--write"]:
        DEPLOY_FILE.write_text(deploy_manifest())
        print(f"wrote {DEPLOY_FILE.relative_to(ROOT)}")
        return 0
    if len(argv) == 3 and argv[1] == "--values-json":
        # Used by tests/e2e to install the chart with non-default values.
        values = json.loads(argv[2])
        if not isinstance(values, dict):
            print("--values-json wants a JSON object", file=sys.stderr)
            return 2
        sys.stdout.write(deploy_manifest(values))
        return 0
    if argv[1:]:
        print("usage: render.py [--write | --values-json '{...}']", file=sys.stderr)
        return 2
    sys.stdout.write(deploy_manifest())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
