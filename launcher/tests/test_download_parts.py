"""The parts of a download that need no Hub: which files serving fetches, the progress it reports, stale partial
files, and the checks made before the first byte."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from tandem_launcher.cli import parse_config
from tandem_launcher.download import build_download_parser
from tandem_launcher.hub import read_token_file
from tandem_launcher.hub_cache import STALE_PARTIAL_S, check_free_space, format_bytes, remove_stale_partials
from tandem_launcher.hub_errors import HubError
from tandem_launcher.hub_files import RepoFile, select_serving_files
from tandem_launcher.hub_request import hub_offline
from tandem_launcher.progress import DownloadProgress


def files(*names: str, size: int = 10) -> list[RepoFile]:
    return [RepoFile(name, size) for name in names]


def test_serving_takes_config_tokenizer_template_and_safetensors_with_their_index_only() -> None:
    listing = files(
        ".gitattributes", "README.md", "config.json", "generation_config.json", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "tokenizer.model",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "consolidated.safetensors", "pytorch_model.bin", "original/consolidated.00.pth", "original/params.json",
        "onnx/model.onnx", "model.Q4_0.gguf",
    )  # fmt: skip
    selection = select_serving_files(listing, "acme/full", allow_pickle_weights=True)
    assert selection.names == (
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "chat_template.jinja", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    )  # fmt: skip
    assert not selection.pickled and selection.size == 90


def test_pickle_weights_are_taken_only_when_allowed_and_there_are_no_safetensors() -> None:
    listing = files(
        "config.json", "tokenizer.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json", "training_args.bin",
    )  # fmt: skip
    with pytest.raises(HubError, match=r"has only pickle weights \(pytorch_model-00001-of-00002\.bin, pytorch_model-"):
        select_serving_files(listing, "acme/old", allow_pickle_weights=False)
    selection = select_serving_files(listing, "acme/old", allow_pickle_weights=True)
    assert selection.pickled
    assert selection.names[2:] == (
        "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json",
    )  # fmt: skip


def test_repos_serving_cannot_use_are_refused_with_what_to_do() -> None:
    with pytest.raises(HubError, match=r"acme/x has no \*\.safetensors weights at its top level"):
        select_serving_files(files("config.json", "tokenizer.json", "original/model.safetensors"), "acme/x", False)
    with pytest.raises(HubError, match=r"holds GGUF files \(a\.gguf, b\.gguf\).*pass --gguf-file"):
        select_serving_files(files("a.gguf", "b.gguf", "README.md"), "acme/x", False)
    with pytest.raises(HubError, match=r"acme/x has no tokenizer\.json at its top level.*fast tokenizer"):
        select_serving_files(files("config.json", "tokenizer.model", "model.safetensors"), "acme/x", False)


def test_the_free_space_check_names_both_sizes(tmp_path: Path) -> None:
    check_free_space("acme/x", 0, 0, tmp_path / "not" / "yet")
    with pytest.raises(HubError) as refused:
        check_free_space("acme/x", 2**60, 3, tmp_path / "not" / "yet")
    message = str(refused.value)
    assert message.startswith(
        "not enough disk space: acme/x needs 1048576.0 TiB for 3 file(s), but the volume of "
        f"{tmp_path}/not/yet has only "
    )
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(999) == "999 B"


def test_only_partial_files_untouched_for_a_while_are_removed(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    stale, live, complete = blobs / "a.1234.incomplete", blobs / "b.5678.incomplete", blobs / "c"
    for path in (stale, live, complete):
        path.write_bytes(b"x")
    old = time.time() - STALE_PARTIAL_S - 1
    os.utime(stale, (old, old))
    os.utime(complete, (old, old))
    remove_stale_partials(tmp_path)
    assert sorted(path.name for path in blobs.iterdir()) == ["b.5678.incomplete", "c"]


def test_token_files_and_offline_flags(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("\n  hf_abc  \n")
    assert read_token_file(token) == "hf_abc"
    token.write_text("\n")
    with pytest.raises(HubError, match="is empty"):
        read_token_file(token)
    with pytest.raises(HubError, match="cannot read the Hugging Face token file"):
        read_token_file(tmp_path / "absent")
    assert hub_offline({"HF_HUB_OFFLINE": "1"}) and hub_offline({"TRANSFORMERS_OFFLINE": "true"})
    assert not hub_offline({"HF_HUB_OFFLINE": "0"})


def test_the_launcher_and_the_subcommand_share_flag_names_and_variables(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("hf_x\n")
    config = parse_config(["--model-id", "acme/r", "--gguf-file", "m.Q4_0.gguf", "--hf-token-file", str(token)], {})
    assert (config.gguf_file, config.hf_token_file) == ("m.Q4_0.gguf", token)
    environ = {"MODEL_ID": "acme/env", "REVISION": "v1", "HF_TOKEN_FILE": str(token), "MODEL_CACHE_DIR": "/c"}
    args = build_download_parser(environ).parse_args([])
    assert (args.model_id, args.revision, args.hf_token_file, str(args.model_cache_dir)) == (
        "acme/env",
        "v1",
        token,
        "/c",
    )
    assert build_download_parser(environ).parse_args(["acme/arg"]).model_id == "acme/arg"


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--gguf-file", "model.bin"], "--gguf-file must name a .gguf file, got 'model.bin'"),
        (["--hf-token-file", "/nonexistent/token"], "--hf-token-file /nonexistent/token is not a readable file"),
    ],
)
def test_bad_model_source_flags_are_usage_errors(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_config(argv, {})
    assert problem in capsys.readouterr().err


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_progress_is_logged_with_bytes_rate_and_time_left() -> None:
    clock, lines = FakeClock(), []
    progress = DownloadProgress(
        "acme/x", 4 * 1024**2, 2, stream=io.StringIO(), interval_s=3600, clock=clock, log=lines.append
    )
    received = progress.tqdm_class(total=0, unit="B", desc="Downloading bytes")
    written = progress.tqdm_class(total=0, unit="B", desc="Reconstructing")
    done = progress.tqdm_class(total=2, desc="Fetching 2 files")
    clock.now += 2.0
    received.update(1024**2)
    written.update(1024**2)  # the same bytes, counted twice by huggingface_hub
    done.update(1)
    assert progress.line() == ("downloading acme/x: 1.0 MiB of 4.0 MiB (25%), 512.0 KiB/s, 6s left, 1 of 2 files")
    clock.now += 6.0
    written.update(3 * 1024**2)
    progress.close()
    assert lines == ["downloaded 4.0 MiB of acme/x in 8s (512.0 KiB/s)"]


def test_off_a_terminal_a_line_is_logged_every_interval() -> None:
    lines: list[str] = []
    progress = DownloadProgress("acme/x", 1024, 1, stream=io.StringIO(), interval_s=0.05, log=lines.append)
    progress.tqdm_class(unit="B").update(512)
    deadline = time.monotonic() + 5
    while len(lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    progress.close()
    assert lines[0].startswith("downloading acme/x: 512 B of 1.0 KiB (50%), ") and "left" in lines[0]
    assert lines[-1].startswith("downloaded 512 B of acme/x in ")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_progress_is_one_bar() -> None:
    stream = Terminal()
    lines: list[str] = []
    progress = DownloadProgress("acme/x", 2048, 1, stream=stream, log=lines.append)
    with progress.tqdm_class(unit="B", total=2048) as bar:
        bar.update(1024)
        bar.update(1024)
    progress.close()
    assert "downloading acme/x: 100%" in stream.getvalue() and "2.00k/2.00k" in stream.getvalue()
    assert lines[0].startswith("downloaded 2.0 KiB of acme/x in ")
