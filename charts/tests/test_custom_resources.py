"""The rendered LeaderWorkerSet and InferencePool are valid for the CRDs their projects ship (strictly: no field the
schema does not list), and a misspelt field or a wrong version is refused."""

from __future__ import annotations

import copy
import http.server
import socket
import threading
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crds
import kubernetes_validate
import pytest
from crds import INFERENCE_POOL, LEADER_WORKER_SET, CrdSource, CrdValidator, ProxyUnreachable
from helm import objects_of_kind

KUBERNETES_VERSION = "1.36.0"


def validator_of(source: CrdSource) -> CrdValidator:
    try:
        return CrdValidator.of(source)
    except ProxyUnreachable as unreachable:
        pytest.skip(f"{source.module}@{source.version}'s CRD is not cached and {unreachable}")


@pytest.fixture(scope="module")
def lws_crd() -> CrdValidator:
    return validator_of(LEADER_WORKER_SET)


@pytest.fixture(scope="module")
def pool_crd() -> CrdValidator:
    return validator_of(INFERENCE_POOL)


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (manifest,) = objects_of_kind(objects, kind)
    return manifest


def test_crds_come_from_the_pinned_module_versions(lws_crd: CrdValidator, pool_crd: CrdValidator) -> None:
    assert (lws_crd.group, lws_crd.kind, sorted(lws_crd.schemas)) == (
        "leaderworkerset.x-k8s.io",
        "LeaderWorkerSet",
        ["v1"],
    )
    assert (pool_crd.group, pool_crd.kind, sorted(pool_crd.schemas)) == (
        "inference.networking.k8s.io",
        "InferencePool",
        ["v1"],
    )


def test_leader_worker_set_is_valid_for_the_lws_crd(
    rendered: dict[str, list[dict[str, Any]]], lws_crd: CrdValidator
) -> None:
    assert lws_crd.errors(only(rendered["multi-node"], "LeaderWorkerSet")) == []


@pytest.mark.parametrize("value_set", ["multi-node", "inference-pool"])
def test_inference_pool_is_valid_for_the_inference_extension_crd(
    rendered: dict[str, list[dict[str, Any]]], pool_crd: CrdValidator, value_set: str
) -> None:
    assert pool_crd.errors(only(rendered[value_set], "InferencePool")) == []


def test_leader_and_worker_pod_templates_are_valid_kubernetes_pod_templates(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    templates = only(rendered["multi-node"], "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()}}
        kubernetes_validate.validate({**pod_template, "template": templates[role]}, KUBERNETES_VERSION, strict=True)


def test_a_misspelt_leader_worker_set_field_is_refused(
    rendered: dict[str, list[dict[str, Any]]], lws_crd: CrdValidator
) -> None:
    group = copy.deepcopy(only(rendered["multi-node"], "LeaderWorkerSet"))
    group["spec"]["leaderWorkerTemplate"]["groupSize"] = group["spec"]["leaderWorkerTemplate"].pop("size")
    assert lws_crd.errors(group) == [
        "spec.leaderWorkerTemplate: Additional properties are not allowed ('groupSize' was unexpected)"
    ]


def test_a_wrong_field_deep_in_a_pod_template_or_a_wrong_policy_is_refused(
    rendered: dict[str, list[dict[str, Any]]], lws_crd: CrdValidator
) -> None:
    group = copy.deepcopy(only(rendered["multi-node"], "LeaderWorkerSet"))
    worker = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    worker["readinessProbe"] = {"httpGet": {"path": "/ready", "port": "http"}, "periodSecond": 5}
    group["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RecreateGroupOnRestart"
    errors = lws_crd.errors(group)
    assert len(errors) == 2, errors
    assert any("'periodSecond' was unexpected" in error for error in errors), errors
    assert any(error.startswith("spec.leaderWorkerTemplate.restartPolicy: ") for error in errors), errors


def test_a_misspelt_inference_pool_field_or_an_older_api_version_is_refused(
    rendered: dict[str, list[dict[str, Any]]], pool_crd: CrdValidator
) -> None:
    pool = copy.deepcopy(only(rendered["inference-pool"], "InferencePool"))
    pool["spec"]["targetPortNumber"] = pool["spec"].pop("targetPorts")[0]["number"]
    errors = pool_crd.errors(pool)
    assert "spec: 'targetPorts' is a required property" in errors, errors
    assert "spec: Additional properties are not allowed ('targetPortNumber' was unexpected)" in errors, errors
    alpha = {
        **only(rendered["inference-pool"], "InferencePool"),
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
    }
    (refused,) = pool_crd.errors(alpha)
    assert "is not served by this CRD" in refused


class ModuleProxy(http.server.BaseHTTPRequestHandler):
    """A Go module proxy on this machine serving one zip that is not the pinned one, and 404 for the rest."""

    def do_GET(self) -> None:
        if self.path == "/example.com/!tandem/@v/v1.0.0.zip":
            body = b"PK not the pinned zip"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def local_proxy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ModuleProxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(crds, "CACHE", tmp_path / "crds")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("GOPROXY", f"{url},direct")
    yield url
    server.shutdown()
    thread.join()


def fake_source(version: str) -> CrdSource:
    return CrdSource(module="example.com/Tandem", version=version, zip_sha256="0" * 64, path="crd.yaml")


def test_a_zip_that_is_not_the_pinned_one_is_refused(local_proxy: str) -> None:
    with pytest.raises(ValueError, match="pinned 0000"):
        CrdValidator.of(fake_source("v1.0.0"))
    assert not crds.CACHE.exists()


def test_a_version_the_proxy_does_not_have_fails_rather_than_skips(local_proxy: str) -> None:
    with pytest.raises(urllib.error.HTTPError):
        CrdValidator.of(fake_source("v9.9.9"))


def test_an_unreachable_proxy_is_reported_as_such(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setattr(crds, "CACHE", tmp_path / "crds")
    monkeypatch.setenv("GOPROXY", f"http://127.0.0.1:{port}")
    with pytest.raises(ProxyUnreachable, match=f"127.0.0.1:{port} is unreachable"):
        CrdValidator.of(fake_source("v1.0.0"))
