"""The Helm chart lints, renders valid Kubernetes objects and hands the launcher argv it accepts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm import CHART, VALUE_SETS, objects_of_kind, serving_pod
from launcher_args import launcher_config
from tandem_launcher.download import build_download_parser

KUBERNETES_VERSION = "1.36.0"
# Custom resources: no Kubernetes schema. The prometheus-operator's PromQL is checked with promtool; the
# LeaderWorkerSet and the InferencePool against their CRDs in test_custom_resources.py.
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "LeaderWorkerSet", "InferencePool"}


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (tandem,) = serving_pod(objects)["spec"]["containers"]
    return tandem


def test_chart_lints_cleanly_for_every_value_set(helm: str) -> None:
    for files, overrides in VALUE_SETS.values():
        argv = [helm, "lint", "--strict", str(CHART)]
        argv += [arg for name in files for arg in ("-f", str(CHART / name))]
        argv += [arg for override in overrides for arg in ("--set", override)]
        subprocess.run(argv, check=True, capture_output=True, text=True)


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_rendered_object_is_valid_for_kubernetes(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    checked = 0
    for manifest in rendered[value_set]:
        if manifest["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rendered_args_are_accepted_by_the_launcher_parser(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    tandem = container(rendered[value_set])
    assert tandem["command"] == ["tandem-launcher"]
    config = launcher_config(tandem["args"])
    assert config.hostname == "0.0.0.0"
    assert config.port == tandem["ports"][0]["containerPort"]
    shard_ports = [port["containerPort"] for port in tandem["ports"] if port["name"].startswith("shard-")]
    local_ranks = config.num_shard // config.nnodes
    assert shard_ports == [config.shard_metrics_port + rank for rank in range(local_ranks)]


def init_containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return serving_pod(objects)["spec"].get("initContainers", [])


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_a_repo_id_is_downloaded_by_an_init_container_with_the_launchers_model_flags(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    tandem = container(rendered[value_set])
    served = launcher_config(tandem["args"])
    downloads = init_containers(rendered[value_set])
    if value_set in ("cpu", "air-gapped"):  # the embedded model, or a model already in the PVC
        assert downloads == []
        return
    (download,) = downloads
    assert download["command"] == ["tandem-launcher"] and download["args"][0] == "download"
    args = build_download_parser({}).parse_args(download["args"][1:])
    assert (args.model_id, args.revision, args.gguf_file) == (served.model_id, served.revision, served.gguf_file)
    assert (args.allow_pickle_weights, args.model_cache_dir) == (served.allow_pickle_weights, served.model_cache_dir)
    draft = (args.speculative_model, args.speculative_model_revision)
    assert draft == (served.speculative_model, served.speculative_model_revision)
    assert {"name": "HF_HOME", "value": "/data/huggingface"} in download["env"]
    assert args.lora_adapters == list(served.lora_adapters)
    mounts = {mount["name"]: mount["mountPath"] for mount in download["volumeMounts"]}
    # The adapters' volume, where the values give one, so local adapter paths are checked where they are served.
    mounts.pop("lora-adapters", None)
    assert mounts == {"model-cache": "/data", "tmp": "/tmp"}


def test_air_gapped_values_serve_from_the_existing_claim_without_the_hub(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    tandem = container(rendered["air-gapped"])
    config = launcher_config(tandem["args"])
    assert (config.model_id, config.revision) == (
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        "0123456789abcdef0123456789abcdef01234567",
    )
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in tandem["env"]
    assert not [env for env in tandem["env"] if env["name"] in ("HF_TOKEN", "HF_ENDPOINT")]
    assert objects_of_kind(rendered["air-gapped"], "PersistentVolumeClaim") == []


def test_gpu_value_set_requests_one_gpu_per_shard_and_wires_secrets(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["gpu-4-shard"]
    tandem = container(objects)
    assert tandem["resources"]["limits"]["nvidia.com/gpu"] == 4
    config = launcher_config(tandem["args"])
    assert (config.num_shard, config.model_id, config.revision, config.max_total_tokens) == (
        4,
        "meta-llama/Llama-3.1-70B-Instruct",
        "main",
        8192,
    )
    assert config.forwarded["kv_cache_dtype"] == "bfloat16"
    secrets = {env["name"]: env["valueFrom"]["secretKeyRef"]["name"] for env in tandem["env"] if "valueFrom" in env}
    assert secrets == {"API_KEY": "tandem-api-key"}  # the Hugging Face token goes to the download only
    (download,) = init_containers(objects)
    download_env = {
        env["name"]: env.get("value") or env["valueFrom"]["secretKeyRef"]["name"] for env in download["env"]
    }
    assert download_env["HF_TOKEN"] == "hf-token" and "API_KEY" not in download_env
    assert download_env["HF_ENDPOINT"] == "https://hub-mirror.example.internal"
    (monitor,) = objects_of_kind(objects, "ServiceMonitor")
    assert [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]] == [
        "http",
        *(f"shard-{r}" for r in range(4)),
    ]
    (dashboard,) = objects_of_kind(objects, "ConfigMap")
    assert json.loads(dashboard["data"]["tandem.json"])["uid"] == "tandem-overview"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert len(objects_of_kind(objects, "Ingress")) == 1


def test_cpu_value_set_runs_the_embedded_model_without_gpus(rendered: dict[str, list[dict[str, Any]]]) -> None:
    tandem = container(rendered["cpu"])
    assert "nvidia.com/gpu" not in tandem["resources"].get("limits", {})
    config = launcher_config(tandem["args"])
    assert (config.device, config.forwarded["dtype"], config.forwarded["kv_cache_memory"]) == ("cpu", "auto", "auto")
    assert config.forwarded["kv_cache_dtype"] == "auto"
    assert "--model-id" not in tandem["args"]


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_pod_is_hardened_and_drains_before_it_is_killed(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    pod = serving_pod(rendered[value_set])["spec"]
    tandem = container(rendered[value_set])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert tandem["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert tandem["securityContext"]["readOnlyRootFilesystem"] is True
    pre_stop = int(tandem["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = launcher_config(tandem["args"]).graceful_termination_timeout
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain
    shm = next(volume for volume in pod["volumes"] if volume["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert tandem["startupProbe"]["httpGet"]["path"] == "/health"
    # /health answers 503 while the launcher restarts shards: liveness asks only whether the router answers.
    assert tandem["livenessProbe"]["httpGet"]["path"] == "/metrics"
    assert tandem["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert {"name": "HF_HOME", "value": "/data/huggingface"} in tandem["env"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in tandem["env"]
    for download in init_containers(rendered[value_set]):
        assert download["securityContext"] == tandem["securityContext"]
        assert "nvidia.com/gpu" not in download["resources"].get("limits", {})


def test_autoscaling_value_set_scales_on_queue_depth_and_uses_the_existing_claim(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["autoscaling"]
    (hpa,) = objects_of_kind(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "tandem_queue_size"
    (deployment,) = objects_of_kind(objects, "Deployment")
    assert "replicas" not in deployment["spec"]
    assert objects_of_kind(objects, "PersistentVolumeClaim") == []
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in deployment["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["shared-models"]


def test_alert_rules_are_valid_promql(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    (rule,) = objects_of_kind(rendered["gpu-4-shard"], "PrometheusRule")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule["spec"]))
    subprocess.run([promtool, "check", "rules", str(rules_file)], check=True, capture_output=True, text=True)
    alerts = {entry["alert"] for entry in rule["spec"]["groups"][0]["rules"]}
    assert alerts == {
        "TandemTimeToFirstTokenP99High",
        "TandemErrorRateHigh",
        "TandemKVCacheNearlyFull",
        "TandemPreemptionRateHigh",
    }


def test_helm_test_pod_sends_a_completion(rendered: dict[str, list[dict[str, Any]]]) -> None:
    (pod,) = objects_of_kind(rendered["default"], "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    assert "/v1/completions" in script
    compile(script, "helm-test", "exec")


def test_speculative_values_reach_the_launcher_and_the_draft_model_is_fetched_beside_the_model(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    served = launcher_config(container(rendered["speculative"])["args"])
    assert (served.speculate, served.speculative_method) == (4, "draft")
    assert (served.speculative_model, served.speculative_model_revision) == (
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "main",
    )
    (download,) = init_containers(rendered["speculative"])
    args = build_download_parser({}).parse_args(download["args"][1:])
    assert args.speculative_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    # Off by default: no speculative flag at all, so the launcher's defaults hold.
    default_args = container(rendered["default"])["args"]
    assert not [arg for arg in default_args if arg.startswith("--speculat")]


def test_lora_values_reach_the_launcher_and_the_init_container_which_mount_the_adapters_volume(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    served = launcher_config(container(rendered["lora"])["args"])
    assert [(spec.name, spec.source) for spec in served.lora_adapters] == [
        ("sql", "acme/sql-lora"),
        ("chat", "/adapters/chat"),
    ]
    assert (served.forwarded["max_loras"], served.forwarded["max_cpu_loras"]) == (2, 3)
    assert served.forwarded["allow_runtime_lora_updating"] is True
    (download,) = init_containers(rendered["lora"])
    args = build_download_parser({}).parse_args(download["args"][1:])
    assert [spec.name for spec in args.lora_adapters] == ["sql", "chat"]
    for mounts in (container(rendered["lora"])["volumeMounts"], download["volumeMounts"]):
        assert {"name": "lora-adapters", "mountPath": "/adapters", "readOnly": True} in mounts
    volumes = serving_pod(rendered["lora"])["spec"]["volumes"]
    assert {
        "name": "lora-adapters",
        "persistentVolumeClaim": {"claimName": "lora-adapters", "readOnly": True},
    } in volumes
    # Off by default: no LoRA flag at all, so the launcher serves no adapters and reserves nothing for them.
    default = launcher_config(container(rendered["default"])["args"])
    assert (default.lora_adapters, default.forwarded["max_loras"], default.forwarded["max_cpu_loras"]) == ((), 0, None)
