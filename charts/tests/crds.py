"""CRD schemas from the Go modules that ship them, fetched once through the Go module proxy and pinned by checksum.

A kubeconform-style strict check: an object whose schema lists its properties accepts no others (as the API server
prunes unknown fields, which would silently drop a misspelt one), unless the schema preserves unknown fields.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CACHE = Path.home() / ".cache" / "tandem" / "crds"
DEFAULT_PROXY = "https://proxy.golang.org"
FETCH_TIMEOUT_S = 60.0


class ProxyUnreachable(Exception):
    """The Go module proxy did not answer (no network here): the checks that need it are skipped."""


@dataclass(frozen=True)
class CrdSource:
    """One CRD file inside one version of a Go module, with the SHA-256 of the module zip the proxy serves."""

    module: str
    version: str
    zip_sha256: str
    path: str

    @property
    def cached(self) -> Path:
        return CACHE / f"{self.module.replace('/', '_')}@{self.version}" / Path(self.path).name


LEADER_WORKER_SET = CrdSource(
    module="sigs.k8s.io/lws",
    version="v0.9.0",
    zip_sha256="350a5fd1739c6caaa5bcf22f1fc29357fda4de66cdf572468b60aebeb976eef1",
    path="config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
)
INFERENCE_POOL = CrdSource(
    module="sigs.k8s.io/gateway-api-inference-extension",
    version="v1.6.0",
    zip_sha256="85200102a9afb9c527dafb7a1e5100f4e5a92eef9d69645ce0adea4817bdd4b1",
    path="config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",
)


def proxy_url() -> str:
    """The first proxy of GOPROXY that is a URL (as `go` would ask), else proxy.golang.org."""
    for entry in os.environ.get("GOPROXY", DEFAULT_PROXY).replace("|", ",").split(","):
        if entry.startswith(("https://", "http://")):
            return entry.rstrip("/")
    return DEFAULT_PROXY


def escaped(module: str) -> str:
    """The proxy protocol's case encoding: each upper-case letter becomes '!' and its lower case."""
    return "".join(f"!{char.lower()}" if char.isupper() else char for char in module)


def fetch_module_zip(source: CrdSource) -> bytes:
    """The module zip from the proxy, refused unless its SHA-256 is the pinned one."""
    url = f"{proxy_url()}/{escaped(source.module)}/@v/{source.version}.zip"
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            body = response.read()
    except urllib.error.HTTPError:
        raise  # the proxy answered: a missing version is a failure, not a skip
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        raise ProxyUnreachable(f"the Go module proxy {proxy_url()} is unreachable: {error}") from error
    digest = hashlib.sha256(body).hexdigest()
    if digest != source.zip_sha256:
        raise ValueError(f"{url} has SHA-256 {digest}, pinned {source.zip_sha256}")
    return body


def crd_document(source: CrdSource) -> dict[str, Any]:
    """The CRD, from the cache or extracted once from the verified module zip."""
    if not source.cached.is_file():
        archive = zipfile.ZipFile(io.BytesIO(fetch_module_zip(source)))
        text = archive.read(f"{source.module}@{source.version}/{source.path}")
        source.cached.parent.mkdir(parents=True, exist_ok=True)
        partial = source.cached.with_suffix(".partial")
        partial.write_bytes(text)
        partial.replace(source.cached)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(source.cached.read_text(), Loader=loader)


def closed(schema: Any) -> Any:
    """The schema with every listed set of properties closed, except where Kubernetes keeps unknown fields."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: closed(value) for key, value in schema.items()}
    open_ended = schema.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in schema
    if "properties" in schema and not open_ended:
        result["additionalProperties"] = False
    return result


@dataclass(frozen=True)
class CrdValidator:
    """Validates objects of one CRD's group and served versions against their openAPIV3Schema, strictly."""

    group: str
    kind: str
    schemas: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, source: CrdSource) -> CrdValidator:
        crd = crd_document(source)
        spec = crd["spec"]
        schemas = {
            version["name"]: closed(version["schema"]["openAPIV3Schema"])
            for version in spec["versions"]
            if version.get("served")
        }
        return cls(group=spec["group"], kind=spec["names"]["kind"], schemas=schemas)

    def errors(self, manifest: dict[str, Any]) -> list[str]:
        """Every way the manifest breaks the schema of its apiVersion; [] when it is valid."""
        group, _, version = manifest["apiVersion"].rpartition("/")
        if (group, manifest["kind"]) != (self.group, self.kind) or version not in self.schemas:
            served = ", ".join(f"{self.group}/{name}" for name in self.schemas)
            return [f"{manifest['apiVersion']} {manifest['kind']} is not served by this CRD ({served} {self.kind})"]
        validator = jsonschema.Draft4Validator(self.schemas[version])
        return [
            f"{'.'.join(str(part) for part in error.absolute_path)}: {error.message}"
            for error in validator.iter_errors(json.loads(json.dumps(manifest)))
        ]
