"""multiNode.size > 1: one LeaderWorkerSet whose leader and workers run the launcher as one tensor-parallel group;
inferencePool.enabled: the pool of serving pods and its endpoint picker. The argv goes through the launcher's parser
with the environment LeaderWorkerSet injects."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm import objects_of_kind, render_values, serving_pod, template
from launcher_args import CLUSTER_SECRET_MOUNT, launcher_config
from tandem_launcher.commands import shard_address_argv, shard_argv
from tandem_launcher.model_resolution import ResolvedModel

LEADER_ADDRESS = "tandem-0.tandem.serving"


def lws_environment(worker_index: int) -> dict[str, str]:
    """What LeaderWorkerSet injects into every container of a 2-pod group."""
    return {"LWS_LEADER_ADDRESS": LEADER_ADDRESS, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": str(worker_index)}


def group_templates(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (group,) = objects_of_kind(objects, "LeaderWorkerSet")
    return group["spec"]["leaderWorkerTemplate"]


def tandem_container(pod_template: dict[str, Any]) -> dict[str, Any]:
    (tandem,) = pod_template["spec"]["containers"]
    return tandem


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [candidate for candidate in objects_of_kind(objects, kind) if candidate["metadata"]["name"] == name]
    return found


def test_multi_node_renders_one_recreated_group_instead_of_the_deployment(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["multi-node"]
    assert objects_of_kind(objects, "Deployment") == [named(objects, "Deployment", "tandem-epp")]
    (group,) = objects_of_kind(objects, "LeaderWorkerSet")
    assert (group["spec"]["replicas"], group["spec"]["startupPolicy"]) == (2, "LeaderCreated")
    templates = group["spec"]["leaderWorkerTemplate"]
    assert (templates["size"], templates["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    # Pods of a group are on different nodes: one model cache claim per pod, no shared PVC of the chart.
    assert [claim["metadata"]["name"] for claim in templates["volumeClaimTemplates"]] == ["model-cache"]
    assert objects_of_kind(objects, "PersistentVolumeClaim") == []


def test_leader_and_worker_args_form_one_group_under_the_launchers_parser(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    templates = group_templates(rendered["multi-node"])
    leader = launcher_config(tandem_container(templates["leaderTemplate"])["args"], lws_environment(0))
    worker = launcher_config(tandem_container(templates["workerTemplate"])["args"], lws_environment(1))
    for config in (leader, worker):
        assert (config.num_shard, config.nnodes, config.master_addr) == (8, 2, LEADER_ADDRESS)
        assert (config.master_port, config.shard_grpc_port) == (29500, 50051)
        assert config.model_id == "HuggingFaceTB/SmolLM2-1.7B-Instruct"
    assert (leader.node_rank, worker.node_rank) == (0, 1)
    worker_args = tandem_container(templates["workerTemplate"])["args"]
    assert "--node-rank" not in worker_args  # LWS_WORKER_INDEX says which worker


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def test_the_leaders_router_and_the_workers_shards_meet_on_the_declared_ports(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    templates = group_templates(rendered["multi-node"])
    leader = launcher_config(tandem_container(templates["leaderTemplate"])["args"], lws_environment(0))
    worker = launcher_config(tandem_container(templates["workerTemplate"])["args"], lws_environment(1))
    worker_ports = {
        port["name"]: port["containerPort"] for port in tandem_container(templates["workerTemplate"])["ports"]
    }
    # The leader's router dials each worker rank where LWS names the worker pod, on its declared gRPC port.
    leader_sockets = [Path(f"/tmp/shard-{rank}.sock") for rank in range(leader.layout.local)]
    remote = [
        uri for uri in flag_values(shard_address_argv(leader, leader_sockets), "--shard-uri") if uri.startswith("http")
    ]
    assert remote == [f"http://tandem-0-1.tandem.serving:{worker_ports[f'grpc-{r}']}" for r in range(4)]
    # Each worker rank listens on that port and serves metrics on the port the pod declares for it.
    model = ResolvedModel(path=Path("/data/tandem/model"), served_name="model", max_position_embeddings=None)
    for local in range(worker.layout.local):
        argv = shard_argv(worker, model, local, Path(f"/tmp/shard-{local}.sock"), worker.master_port)
        assert flag_values(argv, "--grpc-port") == [str(worker_ports[f"grpc-{local}"])]
        assert flag_values(argv, "--metrics-port") == [str(worker_ports[f"shard-{local}"])]
        assert flag_values(argv, "--rank") == [str(4 + local)]
        assert flag_values(argv, "--master-addr") == [LEADER_ADDRESS]


def test_each_pod_requests_its_own_gpus_and_only_the_leader_serves_http(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    templates = group_templates(rendered["multi-node"])
    leader, worker = (tandem_container(templates[role]) for role in ("leaderTemplate", "workerTemplate"))
    assert leader["resources"] == worker["resources"]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 4
    leader_ports = {port["name"]: port["containerPort"] for port in leader["ports"]}
    worker_ports = {port["name"]: port["containerPort"] for port in worker["ports"]}
    shard_ports = {f"shard-{r}": 9100 + r for r in range(4)}
    assert leader_ports == {"http": 3000, **shard_ports, "kv-events": 5557, "rendezvous": 29500}
    assert worker_ports == {**{f"shard-{r}": 9100 + r for r in range(4)}, **{f"grpc-{r}": 50051 + r for r in range(4)}}
    assert {"startupProbe", "livenessProbe", "readinessProbe", "lifecycle"} <= leader.keys()
    assert not {"startupProbe", "livenessProbe", "readinessProbe", "lifecycle"} & worker.keys()
    assert [env["name"] for env in leader["env"] if "valueFrom" in env] == ["API_KEY", "POD_IP"]
    assert not [env for env in worker["env"] if "valueFrom" in env]


def test_leader_and_worker_share_the_pod_spec_but_the_router(rendered: dict[str, list[dict[str, Any]]]) -> None:
    templates = group_templates(rendered["multi-node"])
    leader, worker = (templates[role]["spec"] for role in ("leaderTemplate", "workerTemplate"))
    assert leader.keys() == worker.keys()
    assert {key: value for key, value in leader.items() if key != "containers"} == {
        key: value for key, value in worker.items() if key != "containers"
    }
    assert templates["leaderTemplate"]["metadata"] == templates["workerTemplate"]["metadata"]
    (download,) = leader["initContainers"]
    assert download["args"][:2] == ["download", "HuggingFaceTB/SmolLM2-1.7B-Instruct"]
    (leader_container,), (worker_container,) = leader["containers"], worker["containers"]
    for key in ("image", "command", "securityContext", "volumeMounts"):
        assert leader_container[key] == worker_container[key], key


def test_the_cluster_secret_is_a_mounted_file_and_never_on_argv(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["multi-node"]
    templates = group_templates(objects)
    secret = named(objects, "Secret", "tandem-cluster")
    value = base64.b64decode(secret["data"]["secret"]).decode()
    assert len(value) == 64
    for role in ("leaderTemplate", "workerTemplate"):
        pod = templates[role]["spec"]
        tandem = tandem_container(templates[role])
        args = tandem["args"]
        assert args[args.index("--cluster-secret-file") + 1] == CLUSTER_SECRET_MOUNT
        assert not [arg for arg in args if value in arg]
        (volume,) = [volume for volume in pod["volumes"] if volume["name"] == "cluster-secret"]
        assert volume["secret"]["secretName"] == "tandem-cluster"
        mount = {"name": "cluster-secret", "mountPath": "/etc/tandem/cluster", "readOnly": True}
        assert mount in tandem["volumeMounts"]


def test_an_existing_cluster_secret_is_mounted_and_none_is_created(helm: str) -> None:
    objects = render_values(helm, (), ("multiNode.size=3", "multiNode.clusterSecret.existingSecret=tandem-shared"))
    assert objects_of_kind(objects, "Secret") == []
    (group,) = objects_of_kind(objects, "LeaderWorkerSet")
    pod = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    (volume,) = [volume for volume in pod["volumes"] if volume["name"] == "cluster-secret"]
    assert volume["secret"]["secretName"] == "tandem-shared"
    config = launcher_config(tandem_container(group["spec"]["leaderWorkerTemplate"]["workerTemplate"])["args"], {})
    assert (config.nnodes, config.num_shard) == (3, 3)


def test_a_group_without_a_cluster_secret_is_refused(helm: str) -> None:
    refused = template(helm, (), ("multiNode.size=2", "multiNode.clusterSecret.create=false"))
    assert refused.returncode != 0
    assert "multiNode.size > 1 needs the shared secret of the group" in refused.stderr


def test_service_pool_and_autoscaler_reach_the_leaders_and_prometheus_every_pod(
    helm: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered["multi-node"]
    leader_labels = group_templates(objects)["leaderTemplate"]["metadata"]["labels"]
    service = named(objects, "Service", "tandem")
    (pool,) = objects_of_kind(objects, "InferencePool")
    for selector in (service["spec"]["selector"], pool["spec"]["selector"]["matchLabels"]):
        assert selector == {**leader_labels, "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert objects_of_kind(objects, "ServiceMonitor") == []
    (monitor,) = objects_of_kind(objects, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == leader_labels  # leaders and workers
    assert [endpoint["port"] for endpoint in monitor["spec"]["podMetricsEndpoints"]] == [
        "http",
        *(f"shard-{r}" for r in range(4)),
    ]
    scaled = render_values(helm, (), ("multiNode.size=2", "autoscaling.enabled=true"))
    (hpa,) = objects_of_kind(scaled, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "tandem",
    }
    (group,) = objects_of_kind(scaled, "LeaderWorkerSet")
    assert "replicas" not in group["spec"]


def test_the_pool_selects_the_serving_pods_and_names_its_endpoint_picker(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["inference-pool"]
    (pool,) = objects_of_kind(objects, "InferencePool")
    tandem = named(objects, "Deployment", "tandem")
    assert pool["spec"]["selector"]["matchLabels"] == tandem["spec"]["selector"]["matchLabels"]
    assert pool["spec"]["targetPorts"] == [{"number": 3000}]
    reference = pool["spec"]["endpointPickerRef"]
    assert (reference["name"], reference["port"], reference["failureMode"]) == (
        "tandem-epp",
        {"number": 9002},
        "FailClose",
    )
    picker_service = named(objects, "Service", "tandem-epp")
    assert {"name": "grpc-ext-proc", "port": 9002, "targetPort": "grpc", "appProtocol": "kubernetes.io/h2c"} in (
        picker_service["spec"]["ports"]
    )
    picker = named(objects, "Deployment", "tandem-epp")
    picker_labels = picker["spec"]["template"]["metadata"]["labels"]
    assert picker_service["spec"]["selector"] == picker_labels
    assert not set(pool["spec"]["selector"]["matchLabels"].items()) <= set(picker_labels.items())


def test_the_endpoint_picker_watches_this_pool_with_the_rights_it_needs(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["inference-pool"]
    picker = named(objects, "Deployment", "tandem-epp")["spec"]["template"]["spec"]
    (epp,) = picker["containers"]
    args = epp["args"]
    flags = {
        args[i]: args[i + 1]
        for i in range(len(args) - 1)
        if args[i].startswith("--") and not args[i + 1].startswith("--")
    }
    assert (flags["--pool-name"], flags["--pool-namespace"], flags["--pool-group"]) == (
        "tandem",
        "serving",
        "inference.networking.k8s.io",
    )
    assert "--ha-enable-leader-election" in args  # two replicas: one active picker at a time
    config = yaml.safe_load(named(objects, "ConfigMap", "tandem-epp")["data"]["plugins.yaml"])
    assert config["kind"] == "EndpointPickerConfig"
    scorers = [plugin["pluginRef"] for plugin in config["schedulingProfiles"][0]["plugins"]]
    assert scorers == ["queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"]
    assert {"name": "plugins-config", "mountPath": "/config"} in epp["volumeMounts"]
    assert flags["--config-file"] == "/config/plugins.yaml"
    (binding,) = objects_of_kind(objects, "RoleBinding")
    (role,) = objects_of_kind(objects, "Role")
    assert binding["subjects"][0]["name"] == picker["serviceAccountName"] == "tandem-epp"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    granted = {
        (group, resource) for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]
    }
    assert {
        ("", "pods"),
        ("inference.networking.k8s.io", "inferencepools"),
        ("coordination.k8s.io", "leases"),
    } <= granted


def test_a_picker_installed_otherwise_is_referenced_and_none_is_rendered(helm: str) -> None:
    overrides = ("inferencePool.enabled=true", "inferencePool.endpointPicker.enabled=false")
    objects = render_values(helm, (), (*overrides, "inferencePool.endpointPicker.serviceName=llm-d-epp"))
    (pool,) = objects_of_kind(objects, "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["name"] == "llm-d-epp"
    assert [deployment["metadata"]["name"] for deployment in objects_of_kind(objects, "Deployment")] == ["tandem"]
    assert objects_of_kind(objects, "Role") == objects_of_kind(objects, "ServiceAccount") == []
    refused = template(helm, (), overrides)
    assert refused.returncode != 0
    assert "inferencePool.enabled needs an endpoint picker" in refused.stderr


@pytest.mark.parametrize(
    ("override", "refusal"),
    [
        ("multiNode.size=0", "at '/multiNode/size': minimum: got 0, want 1"),
        ("inferencePool.failureMode=Open", "at '/inferencePool/failureMode': value must be one of"),
    ],
)
def test_values_schema_refuses_impossible_group_and_pool_values(helm: str, override: str, refusal: str) -> None:
    refused = template(helm, (), (override,))
    assert refused.returncode != 0
    assert refusal in refused.stderr


def test_kv_events_are_router_flags_with_their_ports_where_the_router_runs(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    tandem = tandem_container(serving_pod(rendered["inference-pool"]))
    config = launcher_config(tandem["args"])
    assert (config.forwarded["kv_events_endpoint"], config.forwarded["kv_events_replay_endpoint"]) == (
        "tcp://*:5557",
        "tcp://*:5558",
    )
    assert (config.forwarded["kv_events_topic"], config.forwarded["kv_events_hash_seed"]) == (
        "kv@$(POD_IP):3000@smollm2",
        "42",
    )
    ports = {port["name"]: port["containerPort"] for port in tandem["ports"]}
    assert (ports["kv-events"], ports["kv-replay"]) == (5557, 5558)
    # Kubernetes substitutes $(POD_IP) in args because the container defines it.
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in tandem["env"]
    templates = group_templates(rendered["multi-node"])
    leader = launcher_config(tandem_container(templates["leaderTemplate"])["args"], lws_environment(0))
    worker = launcher_config(tandem_container(templates["workerTemplate"])["args"], lws_environment(1))
    assert (leader.forwarded["kv_events_endpoint"], leader.forwarded["kv_events_replay_endpoint"]) == (
        "tcp://*:5557",
        None,
    )
    assert worker.forwarded["kv_events_endpoint"] is None  # a worker runs no router
    default = tandem_container(serving_pod(rendered["default"]))
    assert launcher_config(default["args"]).forwarded["kv_events_endpoint"] is None
    assert not [port for port in default["ports"] if port["name"].startswith("kv-")]
    assert "POD_IP" not in [env["name"] for env in default["env"]]


def test_a_plugins_configuration_of_ones_own_replaces_the_pickers_default(helm: str, tmp_path: Path) -> None:
    own = yaml.safe_dump(
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [{"type": "queue-scorer"}],
        }
    )
    values = tmp_path / "picker.yaml"
    values.write_text(yaml.safe_dump({"inferencePool": {"enabled": True, "endpointPicker": {"pluginsConfig": own}}}))
    objects = render_values(helm, (str(values),), ())
    assert named(objects, "ConfigMap", "tandem-epp")["data"]["plugins.yaml"].strip() == own.strip()
