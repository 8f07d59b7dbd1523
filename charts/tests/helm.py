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
    # Two pods of 4 GPUs per group (TP = 8) as a LeaderWorkerSet, behind an InferencePool and its endpoint picker.
    "multi-node": (
        (),
        (
            "multiNode.size=2",
            "numShard=4",
            "replicaCount=2",
            "secrets.apiKey.existingSecret=tandem-api-key",
            "metrics.serviceMonitor.enabled=true",
            "inferencePool.enabled=true",
            "kvEvents.enabled=true",
            "kvEvents.replayPort=null",
        ),
    ),
    # LoRA adapters: one fetched from the Hub by the init container, one on a mounted volume, loadable at run time.
    "lora": (
        (),
        (
            "lora.adapters=sql=acme/sql-lora\\,chat=/adapters/chat",
            "lora.maxLoras=2",
            "lora.maxCpuLoras=3",
            "lora.runtimeUpdates=true",
            "lora.volume.existingClaim=lora-adapters",
        ),
    ),
    # Speculative decoding with a draft model fetched by the init container beside the served model.
    "speculative": (
        (),
        (
            "speculative.speculate=4",
            "speculative.model=HuggingFaceTB/SmolLM2-135M-Instruct",
            "speculative.revision=main",
        ),
    ),
    # Replicas of one pod each behind an InferencePool whose endpoint picker runs two replicas (leader election), each
    # publishing KV-cache events under a topic naming the pod.
    "inference-pool": (
        (),
        (
            "replicaCount=3",
            "inferencePool.enabled=true",
            "inferencePool.failureMode=FailClose",
            "inferencePool.endpointPicker.replicas=2",
            "autoscaling.enabled=true",
            "kvEvents.enabled=true",
            "kvEvents.topic=kv@$(POD_IP):3000@smollm2",
            "kvEvents.hashSeed=42",
        ),
    ),
}


def helm_binary() -> str:
    """Builds helm on first use (minutes), then returns the cached binary's path at once."""
    built = subprocess.run([str(ENSURE_HELM)], check=True, capture_output=True, text=True)
    return built.stdout.strip()


def template(helm: str, files: tuple[str, ...], overrides: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart with values files of the chart and --set overrides, whatever its outcome."""
    argv = [helm, "template", "tandem", str(CHART), "--namespace", "serving"]
    for name in files:
        argv += ["-f", str(CHART / name)]
    for override in overrides:
        argv += ["--set", override]
    return subprocess.run(argv, check=False, capture_output=True, text=True)


def render_values(helm: str, files: tuple[str, ...], overrides: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rendered objects (empty documents dropped); a chart that refuses the values fails with helm's words."""
    rendered = template(helm, files, overrides)
    assert rendered.returncode == 0, rendered.stderr
    return [document for document in yaml.safe_load_all(rendered.stdout) if document]


def render(helm: str, value_set: str) -> list[dict[str, Any]]:
    """`helm template` of one value set, as parsed objects."""
    return render_values(helm, *VALUE_SETS[value_set])


def serving_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod template where the router runs: the Deployment's, or the LeaderWorkerSet's leader template."""
    groups = objects_of_kind(objects, "LeaderWorkerSet")
    if groups:
        (group,) = groups
        return group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    (deployment,) = [
        candidate
        for candidate in objects_of_kind(objects, "Deployment")
        if candidate["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "tandem"
    ]
    return deployment["spec"]["template"]


def objects_of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The rendered objects of one kind."""
    return [candidate for candidate in objects if candidate["kind"] == kind]
