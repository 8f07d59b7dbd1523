"""Renders the Tandem chart with a helm binary built once through the Go module proxy."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "tandem"
ENSURE_HELM = Path(__file__).resolve().parent / "ensure-helm.sh"

# Value sets every check runs over: name -> (values files in the chart, --set overrides).
VALUE_SETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "cpu": (("values-cpu.yaml",), ()),
    "gpu-4-shard": (
        (),
        (
            "numShard=4",
            "kvCacheDtype=bfloat16",
            "model.id=meta-llama/Llama-3.1-70B-Instruct",
            "model.revision=main",
            "limits.maxTotalTokens=8192",
            "ingress.enabled=true",
            "secrets.hfToken.existingSecret=hf-token",
            "secrets.apiKey.existingSecret=tandem-api-key",
            "hub.endpoint=https://hub-mirror.example.internal",
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "metrics.dashboard.enabled=true",
        ),
    ),
    # Air-gapped: the model is already in the cache PVC; nothing talks to the Hub.
    "air-gapped": (
        (),
        (
            "model.offline=true",
            "model.revision=0123456789abcdef0123456789abcdef01234567",
            "modelCache.existingClaim=prefilled-models",
        ),
    ),
    "autoscaling": (
        (),
        ("autoscaling.enabled=true", "modelCache.existingClaim=shared-models", "extraArgs={--log-requests}"),
    ),
}


def helm_binary() -> str:
    """Builds helm on first use (minutes), then returns the cached binary's path at once."""
    built = subprocess.run([str(ENSURE_HELM)], check=True, capture_output=True, text=True)
    return built.stdout.strip()


def render(helm: str, value_set: str) -> list[dict[str, Any]]:
    """`helm template` of one value set, as parsed objects (empty documents dropped)."""
    files, overrides = VALUE_SETS[value_set]
    argv = [helm, "template", "tandem", str(CHART), "--namespace", "serving"]
    for name in files:
        argv += ["-f", str(CHART / name)]
    for override in overrides:
        argv += ["--set", override]
    rendered = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return [document for document in yaml.safe_load_all(rendered) if document]


def objects_of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The rendered objects of one kind."""
    return [candidate for candidate in objects if candidate["kind"] == kind]
