"""Which files of a repo serving needs: config, tokenizer, chat template and one copy of the weights."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatch

from tandem_launcher.hub_errors import HubError

# What the router and the shards read besides the weights (special_tokens_map.json is for tools such as transformers
# reading the same directory). Nothing in a subdirectory (`original/`, ...) is ever fetched.
SERVING_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
REQUIRED_FILES = ("config.json", "tokenizer.json")
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
PICKLE_WEIGHTS = "pytorch_model*.bin"
# Mistral-style repos ship one `consolidated.safetensors` beside the sharded files: the same weights twice.
_DUPLICATE_PREFIXES = ("consolidated",)


@dataclass(frozen=True)
class RepoFile:
    """One file of a repo at a commit."""

    path: str
    size: int


@dataclass(frozen=True)
class Selection:
    """The files of a repo that serving needs."""

    files: tuple[RepoFile, ...]
    pickled: bool

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(file.path for file in self.files)

    @property
    def size(self) -> int:
        return sum(file.size for file in self.files)


def select_serving_files(files: Iterable[RepoFile], label: str, allow_pickle_weights: bool) -> Selection:
    """Config, tokenizer, chat template and safetensors weights with their index; pickle weights only when allowed and
    there are no safetensors. Raises with what to do when the repo has nothing Tandem can serve."""
    top = {file.path: file for file in files if "/" not in file.path}
    chosen = [top[name] for name in SERVING_FILES if name in top]
    safetensors = sorted(
        (
            file
            for name, file in top.items()
            if name.endswith(".safetensors") and not name.startswith(_DUPLICATE_PREFIXES)
        ),
        key=lambda file: file.path,
    )
    pickled = False
    if safetensors:
        weights = safetensors + ([top[SAFETENSORS_INDEX]] if SAFETENSORS_INDEX in top else [])
    else:
        pickles = sorted((file for name, file in top.items() if fnmatch(name, PICKLE_WEIGHTS)), key=lambda f: f.path)
        if not pickles:
            raise HubError(_no_weights_message(label, top))
        if not allow_pickle_weights:
            shown = ", ".join(file.path for file in pickles[:3])
            raise HubError(
                f"{label} has only pickle weights ({shown}), which Tandem does not load by default because unpickling "
                "can run arbitrary code: pass --allow-pickle-weights if you trust the repo (they are then downloaded "
                "and converted to safetensors once), or pick a repo with *.safetensors weights"
            )
        pickled = True
        weights = pickles + ([top[PICKLE_INDEX]] if PICKLE_INDEX in top else [])
    missing = [name for name in REQUIRED_FILES if name not in top]
    if missing:
        raise HubError(
            f"{label} has no {' and no '.join(missing)} at its top level, which Tandem needs to serve it "
            "(the router needs the fast tokenizer's tokenizer.json): pick a transformers-format repo"
        )
    return Selection(files=tuple(chosen + weights), pickled=pickled)


def _no_weights_message(label: str, top: Mapping[str, RepoFile]) -> str:
    ggufs = sorted(name for name in top if name.endswith(".gguf"))
    if ggufs:
        shown = ", ".join(ggufs[:4]) + (", ..." if len(ggufs) > 4 else "")
        return f"{label} holds GGUF files ({shown}) and no safetensors weights: pass --gguf-file with one of them"
    return f"{label} has no *.safetensors weights at its top level (nor pytorch_model*.bin), so Tandem cannot serve it"
