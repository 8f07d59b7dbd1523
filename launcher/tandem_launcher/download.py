"""`tandem-launcher download MODEL_ID`: fetch a model into the caches and exit (TGI's `download-weights`), for init
containers and image builds. It also runs as the launcher's own download step."""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR, EMBEDDED_MODEL_ID, LOG_LEVELS
from tandem_launcher.flags import FlagAdder
from tandem_launcher.logs import LOGGER, configure_logging, phase
from tandem_launcher.lora_adapters import AdapterResolutionError, resolve_adapters, tgi_adapters
from tandem_launcher.model_resolution import ModelResolutionError, ModelSource, named_as_draft, prepare_model

INTERRUPTED_STATUS = 128


def build_download_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The subcommand's parser; flags share the launcher's names and environment variables."""
    parser = argparse.ArgumentParser(
        prog="tandem-launcher download",
        description=(
            "Fetch a model from the Hugging Face Hub (HF_ENDPOINT for a mirror, HF_TOKEN for gated or private repos) "
            "into the local Hugging Face cache (HF_HOME), convert GGUF or pickle weights into --model-cache-dir, and "
            "exit; `tandem-launcher --model-id` with the same flags then starts without contacting the Hub. A repo "
            "already complete in the cache downloads nothing; interrupted downloads keep their complete files."
        ),
    )
    parser.add_argument(
        "model_id",
        nargs="?",
        default=environ.get("MODEL_ID", EMBEDDED_MODEL_ID),
        help="a Hugging Face repo id (org/name); a local .gguf file or the embedded default is converted "
        f"(default: env MODEL_ID, else {EMBEDDED_MODEL_ID}, the embedded model)",
    )
    add = FlagAdder(parser, environ)
    add.value("--revision", str, None, "branch, tag or commit of the repo; none: its main branch")
    add.value("--gguf-file", str, None, "fetch only this .gguf file of the repo and convert it")
    add.value("--speculative-model", str, None, "also fetch this draft model (speculative decoding), as MODEL_ID is")
    add.value("--speculative-model-revision", str, None, "revision of a --speculative-model repo id; none: main")
    add.value(
        "--lora-adapters", tgi_adapters, "",
        "also fetch these LoRA adapters (Hub repo ids or NAME=REPO items, comma-separated; local paths are checked)",
    )  # fmt: skip
    add.value("--model-cache-dir", Path, str(DEFAULT_MODEL_CACHE_DIR), "where converted models are kept")
    add.value("--hf-token-file", Path, None, "a file holding the Hugging Face token (a mounted secret); else HF_TOKEN")
    add.switch(
        "--allow-pickle-weights", "fetch *.bin pickle weights when the repo has no safetensors, and convert them"
    )
    add.switch("--json-output", "log JSON lines instead of text")
    add.value("--log-level", str, "info", "log level", choices=LOG_LEVELS)
    # The launcher's own download step: the error message goes to this file instead of the log.
    parser.add_argument("--error-file", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Exit status 0 once the model is complete in the cache, 1 when it cannot be fetched, 128+N on signal N."""
    parser = build_download_parser(environ)
    args = parser.parse_args(list(argv))
    if args.speculative_model_revision is not None and args.speculative_model is None:
        parser.error("--speculative-model-revision is the revision of a --speculative-model: give that too")
    configure_logging(args.log_level, args.json_output)
    _exit_at_once_on_signals()
    source = ModelSource(
        model_id=args.model_id,
        revision=args.revision,
        cache_dir=Path(args.model_cache_dir).expanduser(),
        allow_pickle_weights=args.allow_pickle_weights,
        gguf_file=args.gguf_file,
        hf_token_file=None if args.hf_token_file is None else Path(args.hf_token_file).expanduser(),
    )
    try:
        _prepare(source, environ)
        if args.speculative_model is not None:
            with named_as_draft():
                _prepare(source.draft(args.speculative_model, args.speculative_model_revision), environ)
        for name, path in resolve_adapters(args.lora_adapters, source.hf_token_file, environ):
            LOGGER.info("LoRA adapter %s is ready to serve from %s", name, path)
    except (ModelResolutionError, AdapterResolutionError) as error:
        if args.error_file is not None:
            args.error_file.write_text(f"{error}\n")
        else:
            LOGGER.error("%s", error)
        return 1
    return 0


def _prepare(source: ModelSource, environ: Mapping[str, str]) -> None:
    with phase(f"download {source.model_id}"):
        model = prepare_model(source, environ)
    LOGGER.info("%s is ready to serve from %s", source.model_id, model.path)


def _exit_at_once_on_signals() -> None:
    """SIGINT/SIGTERM end the download now; the download threads are not waited for (a file being fetched is
    fetched again next time, complete ones stay)."""

    def _exit(signum: int, _frame: FrameType | None) -> None:
        LOGGER.warning(
            "download interrupted by %s: the files already complete stay in the cache and the next run fetches the "
            "rest",
            signal.Signals(signum).name,
        )
        os._exit(INTERRUPTED_STATUS + signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit)
