"""The one-row decode program compiled ahead of time (AOTInductor) into a package in a persistent cache.

A package is built by a child process (`decode_package_build.py`) from the same checkpoint and weight flags as the
shard, so the shard never imports Inductor and never traces while it serves. It is named by a key over everything
that decides its code and its frozen weights: the checkpoint's files, the weight and cache flags, this package's
sources, torch's version and the CPU's instruction set. A shard that finds its package loads it in a fraction of a
second; any change of those gives another name, so a stale package is never loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tandem_server
from tandem_server.execution.decode_program import input_count
from tandem_server.execution.package_constants import load_sharing_model

# The name a package's model is stored under inside the package (AOTInductor's default).
_MODEL_NAME = "model"
_PACKAGE_GLOB = "decode-*.pt2"
# Packages a cache keeps besides the one just used: the most recently used ones (each is about the size of the
# quantized weights, and every change of model, flag, source or torch names a new one).
KEPT_PACKAGES = 3
_SOURCE_ROOT = Path(tandem_server.__file__).parent


@dataclass(frozen=True)
class DecodePackageSpec:
    """What a child process needs to load the shard's model as the shard did, and where packages are cached."""

    model_path: str
    dtype: str
    kv_cache_dtype: str
    quantize: str
    # `--quantized-dense-memory` in bytes; None: auto.
    dense_copy_memory: int | None
    packed_gemm_rows: tuple[int, ...]
    allow_pickle_weights: bool
    num_threads: int
    cache_dir: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DecodePackageSpec:
        fields = json.loads(text)
        fields["packed_gemm_rows"] = tuple(fields["packed_gemm_rows"])
        return cls(**fields)

    def package_path(self) -> Path:
        """Where this spec's package lives in the cache."""
        return Path(self.cache_dir) / f"decode-{package_key(self)[:32]}.pt2"


def package_key(spec: DecodePackageSpec) -> str:
    """A digest of everything that decides a package's code and frozen weights (threads and the cache's place do
    not)."""
    digest = hashlib.sha256()
    flags = dataclasses.asdict(spec)
    del flags["num_threads"], flags["cache_dir"]
    digest.update(json.dumps(flags, sort_keys=True).encode())
    digest.update(f"torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()}".encode())
    _digest_checkpoint(digest, Path(spec.model_path))
    for source in sorted(_SOURCE_ROOT.rglob("*.py")):
        digest.update(str(source.relative_to(_SOURCE_ROOT)).encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _digest_checkpoint(digest: Any, model_path: Path) -> None:
    # Files by name, size and modification time: reading gigabytes of weights would cost more than the compile saves.
    for path in sorted(model_path.rglob("*")):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.relative_to(model_path)} {stat.st_size} {stat.st_mtime_ns}".encode())


def prune_cache(used: Path, keep: int = KEPT_PACKAGES) -> list[Path]:
    """Marks `used` as just used and deletes all but the `keep` most recently used other packages (with their build
    logs) beside it; the deleted packages. A shard that loaded one of them has its own copy."""
    used.touch()
    others = sorted(
        (path for path in used.parent.glob(_PACKAGE_GLOB) if path != used),
        key=lambda path: path.stat().st_mtime_ns,
        reverse=True,
    )
    stale = others[keep:]
    for path in stale:
        path.unlink(missing_ok=True)
        path.with_suffix(".log").unlink(missing_ok=True)
    return stale


class DecodePackage:
    """A loaded package: runs the decode program on a step's flat inputs (`decode_program.flat_inputs`).

    Loading goes through torch's C++ runner directly, so the shard imports none of Inductor's Python. The package is
    unpacked into a temporary directory that is gone once the library is loaded (a mapped file outlives its name), and
    its weights are the eager model's own tensors wherever they are equal (`package_constants.py`)."""

    def __init__(self, path: Path, model: nn.Module, num_layers: int) -> None:
        with tempfile.TemporaryDirectory(prefix="tandem-decode-package-") as unpacked:
            with zipfile.ZipFile(path) as archive:
                archive.extractall(unpacked)
            library = _only(Path(unpacked), f"*/data/aotinductor/{_MODEL_NAME}/*.wrapper.so")
            weights = _only(Path(unpacked), f"*/data/aotinductor/{_MODEL_NAME}/*.wrapper_weights.blob")
            constants = load_sharing_model(library, weights, model)
            # The runner that takes its constants as given (bound, not in torch's stubs) never reads the blob.
            self._runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), 1, constants.tensors)  # type: ignore[call-arg]
        self._inputs = input_count(num_layers)
        self.path = path
        self.shared_bytes = constants.shared_bytes
        self.copied_bytes = constants.copied_bytes

    def run(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """The program's final hidden states; the step's keys and values land in the caches it was given."""
        if len(inputs) != self._inputs:
            raise ValueError(f"invariant: the decode program takes {self._inputs} tensors, got {len(inputs)}")
        (hidden,) = self._runner.run(inputs)
        return hidden

    def constants(self) -> dict[str, torch.Tensor]:
        """The tensors the program reads its weights from, by the package's names for them."""
        return self._runner.extract_constants_map(False)


def _only(root: Path, pattern: str) -> Path:
    matches = list(root.glob(pattern))
    if len(matches) != 1:
        raise DecodePackageFormatError(f"a decode package holds one {pattern}, this one {len(matches)}")
    return matches[0]


class DecodePackageFormatError(RuntimeError):
    """The package's files are not laid out as the builder writes them."""
