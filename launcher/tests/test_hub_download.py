"""`tandem-launcher download` and the launcher's own download step, against a Hub stand-in served over HTTP.

Each test runs the real CLI in a subprocess with its own HF_HOME and HF_ENDPOINT pointed at the stand-in, and
checks both what the user reads and what reached the stand-in."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_download_testing import (
    SERVED,
    child_env,
    last_line,
    point_launcher_at,
    run_download,
    snapshot_of,
    standin_with_repos,
)
from hub_standin import HubStandin
from hub_standin_repos import StandinRepo, synthetic_repo


@pytest.fixture(scope="module")
def standin() -> Iterator[HubStandin]:
    with standin_with_repos() as hub:
        yield hub


def _pickled_repo(repo_id: str) -> StandinRepo:
    import io  # noqa: PLC0415

    import torch  # noqa: PLC0415

    torch.manual_seed(0)
    embed = torch.randn(8, 4)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed, "model.norm.weight": torch.ones(4)}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    files = {
        "config.json": json.dumps({"model_type": "llama", "max_position_embeddings": 64}).encode(),
        "tokenizer.json": b"{}",
        "pytorch_model.bin": buffer.getvalue(),
    }
    return StandinRepo(repo_id, files)


def test_download_fetches_only_what_serving_needs_and_a_second_run_fetches_nothing(
    standin: HubStandin, tmp_path: Path
) -> None:
    first = run_download(tmp_path, standin.url, "acme/tiny", "--model-cache-dir", str(tmp_path / "models"))
    assert first.returncode == 0, first.stderr
    snapshot = snapshot_of(tmp_path, "acme/tiny")
    assert sorted(path.name for path in snapshot.iterdir()) == SERVED
    repo = standin.repos["acme/tiny"]
    assert (snapshot / "model.safetensors").read_bytes() == repo.files["model.safetensors"]
    fetched = {entry.path for entry in standin.logged() if "/resolve/" in entry.path}
    assert not any("README" in path or "original/" in path for path in fetched), fetched
    assert "fetching 5 of 5 files (4.0 MiB) of acme/tiny at commit" in first.stderr
    assert "downloaded 4.0 MiB of acme/tiny in" in first.stderr
    assert f"acme/tiny is ready to serve from {snapshot}" in first.stderr
    # The weights came from the CDN, which never saw the Authorization header (none was sent here anyway).
    assert [entry.server for entry in standin.downloads(repo.sha256("model.safetensors"))] == ["cdn"]

    bodies_before, requests_before = len(standin.downloads()), len(standin.logged())
    second = run_download(tmp_path, standin.url, "acme/tiny")
    assert second.returncode == 0, second.stderr
    assert len(standin.downloads()) == bodies_before
    assert (
        f"acme/tiny is complete in {tmp_path / 'hub'} at commit {repo.commit[:12]}: nothing to fetch" in second.stderr
    )
    asked = [entry.path for entry in standin.logged()[requests_before:] if "acme/tiny" in entry.path]
    assert asked == ["/api/models/acme/tiny"]  # one API call, no file request


def test_a_download_cut_half_way_resumes_with_a_range_request(standin: HubStandin, tmp_path: Path) -> None:
    """huggingface_hub writes 10 MiB chunks: a dropped connection resumes from the last complete chunk."""
    repo = standin.add(synthetic_repo("acme/cut", weights_size=24 * 1024 * 1024))
    size = len(repo.files["model.safetensors"])
    standin.cut_once("acme/cut", "model.safetensors", size // 2)
    result = run_download(tmp_path, standin.url, "acme/cut")
    assert result.returncode == 0, result.stderr
    assert "Trying to resume download" in result.stderr
    first, resumed = standin.downloads(repo.sha256("model.safetensors"))
    assert (first.status, first.range, first.body_bytes) == (200, None, size // 2)
    kept = 10 * 1024 * 1024
    assert (resumed.status, resumed.range, resumed.body_bytes) == (206, f"bytes={kept}-", size - kept)
    cached = snapshot_of(tmp_path, "acme/cut") / "model.safetensors"
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == repo.sha256("model.safetensors")


def test_a_killed_download_keeps_its_complete_files_and_the_next_run_fetches_the_rest(
    standin: HubStandin, tmp_path: Path
) -> None:
    repo = standin.repos["acme/slow"]
    standin.throttle("acme/slow", "model.safetensors", 0.05)
    weights_sha = repo.sha256("model.safetensors")
    process = subprocess.Popen(
        [sys.executable, "-m", "tandem_launcher", "download", "acme/slow"],
        env=child_env(tmp_path, standin.url),
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while standin.streamed(weights_sha) < 256 * 1024:  # a quarter of the weights has been sent
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=10)
    assert process.returncode == 128 + signal.SIGTERM
    assert "download interrupted by SIGTERM: the files already complete stay in the cache" in stderr
    snapshot = snapshot_of(tmp_path, "acme/slow")
    kept = set(os.listdir(snapshot))
    assert "config.json" in kept and "model.safetensors" not in kept
    # Files are fetched in parallel: which small ones finished before the signal depends on the machine's load.
    served = {name for name in repo.files if name != "README.md" and not name.startswith("original/")}
    missing = served - kept

    standin.throttle("acme/slow", "model.safetensors", 0.0)
    resumed = run_download(tmp_path, standin.url, "acme/slow")
    assert resumed.returncode == 0, resumed.stderr
    assert f"fetching {len(missing)} of {len(served)} files (" in resumed.stderr
    assert (snapshot / "model.safetensors").read_bytes() == repo.files["model.safetensors"]


def test_offline_mode_never_contacts_the_endpoint(standin: HubStandin, tmp_path: Path) -> None:
    before = len(standin.logged())
    refused = run_download(tmp_path, standin.url, "acme/tiny", env={"HF_HUB_OFFLINE": "1"})
    assert refused.returncode == 1
    assert last_line(refused).endswith(
        f"model 'acme/tiny' is neither a local directory, a .gguf file, nor complete in the local Hugging Face cache "
        f"(it is not in the local Hugging Face cache ({tmp_path / 'hub'})), and HF_HUB_OFFLINE=1 forbids downloading "
        "it: unset HF_HUB_OFFLINE to let the launcher download it, or fetch it where the Hub is reachable "
        "(`tandem-launcher download acme/tiny`, or `hf download`) into this cache (HF_HOME), or pass a directory"
    )
    assert len(standin.logged()) == before
    assert run_download(tmp_path, standin.url, "acme/tiny").returncode == 0
    before = len(standin.logged())
    offline = run_download(tmp_path, standin.url, "acme/tiny", env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stderr
    assert len(standin.logged()) == before


def test_concurrent_downloads_into_one_cache_fetch_each_file_once_and_agree(
    standin: HubStandin, tmp_path: Path
) -> None:
    repo = standin.add(synthetic_repo("acme/shared", weights_size=1024 * 1024))
    standin.throttle("acme/shared", "model.safetensors", 0.02)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tandem_launcher", "download", "acme/shared"],
            env=child_env(tmp_path, standin.url),
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=120)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    snapshot = snapshot_of(tmp_path, "acme/shared")
    assert (snapshot / "model.safetensors").read_bytes() == repo.files["model.safetensors"]
    assert len(standin.downloads(repo.sha256("model.safetensors"))) == 1
    assert not list((snapshot.parents[1] / "blobs").glob("*.incomplete"))


def test_pickle_weights_need_the_flag_and_are_converted_to_safetensors_once(
    standin: HubStandin, tmp_path: Path
) -> None:
    from safetensors.torch import load_file  # noqa: PLC0415

    standin.add(_pickled_repo("acme/pickled"))
    refused = run_download(tmp_path, standin.url, "acme/pickled")
    assert refused.returncode == 1
    assert last_line(refused).endswith(
        "acme/pickled has only pickle weights (pytorch_model.bin), which Tandem does not load by default because "
        "unpickling can run arbitrary code: pass --allow-pickle-weights if you trust the repo (they are then "
        "downloaded and converted to safetensors once), or pick a repo with *.safetensors weights"
    )
    assert not [entry for entry in standin.logged() if "acme/pickled/resolve" in entry.path]
    models = tmp_path / "models"
    allowed = run_download(
        tmp_path, standin.url, "acme/pickled", "--allow-pickle-weights", "--model-cache-dir", str(models)
    )
    assert allowed.returncode == 0, allowed.stderr
    (converted,) = models.iterdir()
    assert converted.name.startswith("acme--pickled-") and converted.name.endswith("-safetensors")
    assert sorted(path.name for path in converted.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    tensors = load_file(converted / "model.safetensors")
    assert set(tensors) == {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"}
    assert (tensors["lm_head.weight"] == tensors["model.embed_tokens.weight"]).all()
    again = run_download(
        tmp_path, standin.url, "acme/pickled", "--allow-pickle-weights", "--model-cache-dir", str(models)
    )
    assert f"using converted model {converted}" in again.stderr


def test_a_gguf_repo_fetches_only_the_named_file_and_hands_it_to_the_converter(
    standin: HubStandin, tmp_path: Path
) -> None:
    no_flag = run_download(tmp_path, standin.url, "acme/tiny-gguf")
    assert last_line(no_flag).endswith(
        "acme/tiny-gguf holds GGUF files (tiny.Q4_0.gguf, x.Q8_0.gguf) and no safetensors weights: pass --gguf-file "
        "with one of them"
    )
    absent = run_download(tmp_path, standin.url, "acme/tiny-gguf", "--gguf-file", "nope.gguf")
    assert last_line(absent).endswith(
        "acme/tiny-gguf has no file 'nope.gguf'; its GGUF files: tiny.Q4_0.gguf, x.Q8_0.gguf"
    )
    result = run_download(
        tmp_path,
        standin.url,
        "acme/tiny-gguf",
        "--gguf-file",
        "tiny.Q4_0.gguf",
        "--model-cache-dir",
        str(tmp_path / "m"),
    )
    # The stand-in's file is no real GGUF: downloaded, then refused by the conversion step (which real GGUFs pass,
    # see test_embedded_model.py).
    assert result.returncode == 1
    assert last_line(result).endswith("tiny.Q4_0.gguf is not a GGUF file (it does not start with GGUF)")
    assert "/snapshots/" in last_line(result)
    fetched = {entry.path for entry in standin.logged() if "tiny-gguf/resolve" in entry.path}
    assert fetched == {"/acme/tiny-gguf/resolve/main/tiny.Q4_0.gguf"}
    before = len(standin.logged())
    offline = run_download(
        tmp_path, standin.url, "acme/tiny-gguf", "--gguf-file", "tiny.Q4_0.gguf", env={"HF_HUB_OFFLINE": "1"}
    )
    assert last_line(offline).endswith("is not a GGUF file (it does not start with GGUF)")
    assert len(standin.logged()) == before


def test_the_launcher_downloads_a_missing_repo_then_starts(
    standin: HubStandin, tmp_path: Path, launch_fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_launcher_at(monkeypatch, tmp_path / "hf", standin.url)
    launch = launch_fakes(model_id="acme/tiny", model_cache_dir=str(tmp_path / "models"))
    launch.wait_for_output("Tandem is ready")
    assert "fetching 5 of 5 files (4.0 MiB) of acme/tiny" in launch.output
    assert f"model directory: {snapshot_of(tmp_path / 'hf', 'acme/tiny')}" in launch.output
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0
