"""The environment each child gets: an allow-list of what its third-party libraries read, never a credential.

Our own processes take their configuration as argv; the environment only carries settings of the libraries
underneath (locale, Rust logging, torch, CUDA, NCCL, OpenMP). Anything else the launcher was given, such as
`HF_TOKEN`, `API_KEY` or the launcher's own flag variables, stays with the launcher."""

from __future__ import annotations

import re
from collections.abc import Mapping

# What any process needs to find its programs, libraries, locale and temporary directory.
_COMMON_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "NO_COLOR",
        "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SSL_CERT_FILE", "SSL_CERT_DIR",
    }
)  # fmt: skip
_COMMON_PREFIXES = ("LC_",)
# The router is Rust: its logging, backtraces and the tokenizers crate's thread pool.
_ROUTER_NAMES = frozenset({"RUST_LOG", "RUST_BACKTRACE", "RUST_LIB_BACKTRACE", "RAYON_NUM_THREADS"})
_ROUTER_PREFIXES = ("TOKENIZERS_",)
# Shards run torch: its device, collective, kernel-compiler (Triton builds with CC) and threading libraries read these.
_SHARD_NAMES = frozenset({"LD_PRELOAD", "MALLOC_CONF", "XDG_CACHE_HOME", "CC", "CXX"})
_SHARD_PREFIXES = (
    "CUDA_", "NCCL_", "NVIDIA_", "TORCH", "PYTORCH_", "TRITON_", "GLOO_", "OMP_", "MKL_", "KMP_", "ONEDNN_", "DNNL_",
    "OPENBLAS_",
)  # fmt: skip
# Never passed on, whatever list names them: a child that needs a secret gets it from a file the launcher chose.
_CREDENTIAL = re.compile(r"TOKEN(?!IZERS_)|SECRET|PASSW|CREDENTIAL|(^|_)KEY($|_)", re.IGNORECASE)


def _allowed(environ: Mapping[str, str], names: frozenset[str], prefixes: tuple[str, ...]) -> dict[str, str]:
    return {
        name: value
        for name, value in environ.items()
        if (name in names or name in _COMMON_NAMES or name.startswith((*prefixes, *_COMMON_PREFIXES)))
        and _CREDENTIAL.search(name) is None
    }


def router_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The router's environment: locale and Rust settings only, so every flag it obeys is on its argv."""
    return _allowed(environ, _ROUTER_NAMES, _ROUTER_PREFIXES)


def shard_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """A shard's environment: locale plus torch, CUDA, NCCL and OpenMP settings."""
    return _allowed(environ, _SHARD_NAMES, _SHARD_PREFIXES)
