"""LoRA adapters every shard loads beside the model: TGI's `--lora-adapters`, vLLM's `--lora-modules`, each adapter a
local PEFT directory or a Hub repo id, resolved as `--model-id` is (the Hugging Face cache first, the Hub unless
HF_HUB_OFFLINE is set)."""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tandem_launcher.flags import FlagAdder
from tandem_launcher.forwarded import Child, Forwarded, add_forwarded, not_negative, positive
from tandem_launcher.hub import fetch_file, read_token_file
from tandem_launcher.hub_cache import cached_file
from tandem_launcher.hub_errors import HubError
from tandem_launcher.hub_request import HubRequest, hub_cache_dir, hub_offline
from tandem_launcher.progress import DownloadProgress

# Distinct adapters one batch carries when the flag leaves it to the launcher and adapters may be served.
DEFAULT_MAX_LORAS = 4
# What PEFT writes and the shards read.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# An adapter's name as requests give it (OpenAI `model`, TGI `adapter_id`).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$")

LORA_FLAGS = (
    Forwarded(
        "--max-loras", Child.SHARD, int, None,
        "LoRA: most distinct adapters one batch carries, requests under another adapter waiting for one to finish "
        f"(on CUDA each takes a device slot in every changed layer); none: {DEFAULT_MAX_LORAS} with adapters or "
        "--allow-runtime-lora-updating, else 0 (no adapters, nothing reserved for them)",
        check=not_negative,
    ),
    Forwarded(
        "--max-lora-rank", Child.SHARD, int, 64,
        "LoRA: highest adapter rank the shards accept", check=positive,
    ),
    Forwarded(
        "--max-cpu-loras", Child.SHARD, int, None,
        "LoRA: most adapters whose weights stay in each shard's memory, at least --max-loras; a request under one of "
        "the others reads it again from its directory first, in place of the least recently used; none: --max-loras "
        "or the number of start-up adapters, whichever is larger",
        check=positive,
    ),
)  # fmt: skip


def resolve_max_loras(max_loras: int | None, adapters: Sequence[AdapterSpec], runtime_updates: bool) -> int:
    """`--max-loras` as given, else DEFAULT_MAX_LORAS where adapters may be served, else 0."""
    if max_loras is not None:
        return max_loras
    return DEFAULT_MAX_LORAS if adapters or runtime_updates else 0


class AdapterResolutionError(Exception):
    """An adapter cannot be found or fetched, or its directory lacks a PEFT file."""


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter as the flags name it: `source` is a local directory or a Hub repo id."""

    name: str
    source: str


def _spec(name: str, source: str, text: str) -> AdapterSpec:
    name, source = name.strip(), source.strip()
    if not _NAME.match(name) or not source:
        raise argparse.ArgumentTypeError(
            f"not an adapter NAME=PATH_OR_REPO (name: letters, digits and ._/:- up to 128 characters): {text!r}"
        )
    return AdapterSpec(name, source)


def tgi_adapters(text: str) -> list[AdapterSpec]:
    """TGI's `--lora-adapters`: comma-separated `repo_id` (named by itself) or `name=path_or_repo` items."""
    specs = []
    for item in (part.strip() for part in text.split(",")):
        if item:
            name, _, source = item.partition("=")
            specs.append(_spec(name, source or name, item))
    return specs


def vllm_module(text: str) -> AdapterSpec:
    """One of vLLM's `--lora-modules`: `name=path_or_repo`, or JSON `{"name": ..., "path": ...}`."""
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(f"not JSON: {error}: {text!r}") from error
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise argparse.ArgumentTypeError(f'JSON --lora-modules needs "name" and "path" strings: {text!r}')
        return _spec(value["name"], str(value.get("path") or ""), text)
    name, separator, source = text.partition("=")
    if not separator:
        raise argparse.ArgumentTypeError(f"not NAME=PATH_OR_REPO: {text!r}")
    return _spec(name, source, text)


def add_lora_flags(add: FlagAdder) -> None:
    """The adapters to serve and the shards' bounds on them."""
    add.value(
        "--lora-adapters", tgi_adapters, "",
        "LoRA adapters every shard loads, comma-separated: a Hub repo id (named by itself) or NAME=PATH_OR_REPO; "
        "requests select one by name (OpenAI `model`, TGI `adapter_id`)",
    )  # fmt: skip
    add.parser.add_argument(
        "--lora-modules", nargs="+", type=vllm_module, default=[],
        help="vLLM's form of --lora-adapters: NAME=PATH_OR_REPO or JSON {\"name\": ..., \"path\": ...} items",
    )  # fmt: skip
    add_forwarded(add, LORA_FLAGS)


def adapter_problems(specs: Sequence[AdapterSpec], max_loras: int | None, max_cpu_loras: int | None) -> list[str]:
    """Names given twice, and fewer adapters kept in memory than one batch carries."""
    counts = Counter(spec.name for spec in specs)
    twice = sorted(name for name, count in counts.items() if count > 1)
    problems = [
        f"LoRA adapter name {name!r} is given more than once (--lora-adapters, --lora-modules)" for name in twice
    ]
    if max_cpu_loras is not None and max_loras is not None and max_cpu_loras < max_loras:
        problems.append(
            f"--max-cpu-loras {max_cpu_loras} is below --max-loras {max_loras}: every adapter of a batch must be in "
            "memory at once"
        )
    return problems


def resolve_adapters(
    specs: Sequence[AdapterSpec], hf_token_file: Path | None, environ: Mapping[str, str]
) -> tuple[tuple[str, Path], ...]:
    """Each adapter's local PEFT directory, by name, in the order given."""
    return tuple((spec.name, _resolve(spec, hf_token_file, environ)) for spec in specs)


def _resolve(spec: AdapterSpec, hf_token_file: Path | None, environ: Mapping[str, str]) -> Path:
    local = Path(spec.source).expanduser()
    if local.is_dir():
        return _complete(local.resolve(), spec)
    if spec.source.startswith(("/", ".", "~")):
        raise AdapterResolutionError(f"LoRA adapter {spec.name!r}: no such directory: {local}")
    request = HubRequest(spec.source)
    cache = hub_cache_dir()
    cached = [cached_file(request, name, cache) for name in ADAPTER_FILES]
    if all(path is not None for path in cached):
        return _complete(Path(str(cached[0])).parent, spec)
    if hub_offline(environ):
        raise AdapterResolutionError(
            f"LoRA adapter {spec.name!r}: {spec.source} is not in the local Hugging Face cache ({cache}) and "
            "HF_HUB_OFFLINE forbids fetching it"
        )
    token = read_token_file(hf_token_file) if hf_token_file else None
    request = HubRequest(spec.source, token=token)
    try:
        paths = [fetch_file(request, name, cache, DownloadProgress) for name in ADAPTER_FILES]
    except HubError as error:
        raise AdapterResolutionError(f"LoRA adapter {spec.name!r}: {error}") from error
    return _complete(paths[0].parent, spec)


def _complete(directory: Path, spec: AdapterSpec) -> Path:
    missing = [name for name in ADAPTER_FILES if not (directory / name).is_file()]
    if missing:
        raise AdapterResolutionError(
            f"LoRA adapter {spec.name!r}: {directory} lacks {', '.join(missing)} (PEFT's adapter format)"
        )
    return directory
