"""`tandem-launcher download` and the launcher's own download step, against a Hub stand-in served over HTTP.

Each test runs the real CLI in a subprocess with its own HF_HOME and HF_ENDPOINT pointed at the stand-in, and
checks both what the user reads and what reached the stand-in."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_standin import HubStandin, StandinRepo, synthetic_repo

GOOD_TOKEN = "hf_good_token"
NO_ACCESS_TOKEN = "hf_token_without_access"
SERVED = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
# Variables of the machine running the tests that would change what the child does.
_HUB_VARIABLES = ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN_PATH", "MODEL_ID")


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


@pytest.fixture(scope="module")
def standin() -> Iterator[HubStandin]:
    hub = HubStandin(tokens={GOOD_TOKEN, NO_ACCESS_TOKEN})
    hub.add(synthetic_repo("acme/tiny"))
    hub.add(synthetic_repo("acme/gated", gated=True, allowed_tokens={GOOD_TOKEN}))
    hub.add(synthetic_repo("acme/private", private=True, allowed_tokens={GOOD_TOKEN}))
    hub.add(synthetic_repo("acme/huge", weights_size=1024, listed_sizes={"model.safetensors": 2**50}))
    hub.add(synthetic_repo("acme/slow", weights_size=2 * 1024 * 1024))
    hub.add(
        StandinRepo("acme/tiny-gguf", {"README.md": b"#", "tiny.Q4_0.gguf": b"not a GGUF file", "x.Q8_0.gguf": b"G"})
    )
    with hub:
        yield hub


def run_download(
    hf_home: Path,
    endpoint: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem_launcher", "download", *args],
        env=child_env(hf_home, endpoint, env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def child_env(hf_home: Path, endpoint: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if name not in _HUB_VARIABLES}
    return {**environ, "HF_HOME": str(hf_home), "HF_ENDPOINT": endpoint, **(extra or {})}


def snapshot_of(hf_home: Path, repo_id: str) -> Path:
    storage = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    commit = (storage / "refs" / "main").read_text().strip()
    return storage / "snapshots" / commit


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]


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


def test_a_gated_repo_names_the_token_and_the_licence(standin: HubStandin, tmp_path: Path) -> None:
    anonymous = run_download(tmp_path, standin.url, "acme/gated")
    assert anonymous.returncode == 1
    assert last_line(anonymous).endswith(
        f"acme/gated is a gated model and no token was sent (401 Unauthorized): accept its licence on "
        f"{standin.url}/acme/gated, then set HF_TOKEN (or --hf-token-file) to a token of an account that has access"
    )
    no_access = run_download(tmp_path, standin.url, "acme/gated", env={"HF_TOKEN": NO_ACCESS_TOKEN})
    assert no_access.returncode == 1
    assert last_line(no_access).endswith(
        "acme/gated is a gated model and the token's account has no access to it yet (403 Forbidden): accept its "
        f"licence on {standin.url}/acme/gated with that account, or use the token of an account that has"
    )
    assert not (tmp_path / "hub" / "models--acme--gated" / "snapshots").exists() or not any(
        path.name == "model.safetensors" for path in (tmp_path / "hub").rglob("*")
    )

    granted = run_download(tmp_path, standin.url, "acme/gated", env={"HF_TOKEN": GOOD_TOKEN})
    assert granted.returncode == 0, granted.stderr
    weights = standin.downloads(standin.repos["acme/gated"].sha256("model.safetensors"))
    assert [(entry.server, entry.authorized) for entry in weights] == [("cdn", False)]


def test_a_token_file_authenticates_and_an_invalid_token_is_named(standin: HubStandin, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{GOOD_TOKEN}\n")
    result = run_download(tmp_path / "home", standin.url, "acme/private", "--hf-token-file", str(token_file))
    assert result.returncode == 0, result.stderr
    token_file.write_text("hf_unknown\n")
    refused = run_download(tmp_path / "other", standin.url, "acme/private", "--hf-token-file", str(token_file))
    assert refused.returncode == 1
    assert last_line(refused).endswith(
        f"{standin.url} refused the Hugging Face token (401 Unauthorized: invalid credentials): check HF_TOKEN or "
        "--hf-token-file"
    )


def test_a_missing_repo_or_revision_says_what_to_check(standin: HubStandin, tmp_path: Path) -> None:
    missing = run_download(tmp_path, standin.url, "acme/absent")
    assert missing.returncode == 1
    assert last_line(missing).endswith(
        f"acme/absent was not found on {standin.url} (401): check the model id (org/name) and --revision; if it is "
        "a private repo, set HF_TOKEN (or --hf-token-file) to a token of an account that has access"
    )
    with_token = run_download(tmp_path, standin.url, "acme/absent", env={"HF_TOKEN": GOOD_TOKEN})
    assert f"acme/absent was not found on {standin.url} (404)" in last_line(with_token)
    revision = run_download(tmp_path, standin.url, "acme/tiny", "--revision", "v9")
    assert revision.returncode == 1
    assert last_line(revision).endswith(
        f"acme/tiny has no revision 'v9' on {standin.url} (404): check --revision (a branch, a tag or a commit hash)"
    )


def test_an_unreachable_endpoint_says_what_to_do_and_a_complete_cache_still_serves(
    standin: HubStandin, tmp_path: Path
) -> None:
    nowhere = closed_port_url()
    started = time.monotonic()
    refused = run_download(tmp_path, nowhere, "acme/tiny")
    assert time.monotonic() - started < 60
    assert refused.returncode == 1
    message = last_line(refused)
    assert f"cannot reach the Hugging Face Hub at {nowhere} (ConnectError" in message
    assert message.endswith(
        "and acme/tiny is not complete in the local cache: check the network or proxy, point HF_ENDPOINT at a "
        "reachable mirror, or fetch the model where the Hub is reachable (`tandem-launcher download acme/tiny`) and "
        "copy the cache (HF_HOME) here"
    )
    assert run_download(tmp_path, standin.url, "acme/tiny").returncode == 0
    cached = run_download(tmp_path, nowhere, "acme/tiny")
    assert cached.returncode == 0, cached.stderr
    assert "using the complete copy of acme/tiny in the local cache" in cached.stderr


def test_too_little_disk_space_is_refused_before_any_byte_is_fetched(standin: HubStandin, tmp_path: Path) -> None:
    result = run_download(tmp_path, standin.url, "acme/huge")
    assert result.returncode == 1
    message = last_line(result)
    assert "not enough disk space: acme/huge needs 1024.0 TiB for 5 file(s), but the volume of " in message
    assert f"{tmp_path / 'hub'} has only " in message and "modelCache.size" in message
    assert not [entry for entry in standin.logged() if "/resolve/" in entry.path and "acme/huge" in entry.path]


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
    for name in _HUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", standin.url)
    launch = launch_fakes(model_id="acme/tiny", model_cache_dir=str(tmp_path / "models"))
    launch.wait_for_output("Tandem is ready")
    assert "fetching 5 of 5 files (4.0 MiB) of acme/tiny" in launch.output
    assert f"model directory: {snapshot_of(tmp_path / 'hf', 'acme/tiny')}" in launch.output
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0


def test_the_launcher_ends_with_the_download_error_as_its_last_line(
    standin: HubStandin, tmp_path: Path, launch_fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _HUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", standin.url)
    launch = launch_fakes(model_id="acme/gated", model_cache_dir=str(tmp_path / "models"))
    assert launch.finish() == 1
    assert launch.lines[-1].endswith(
        "acme/gated is a gated model and no token was sent (401 Unauthorized): accept "
        f"its licence on {standin.url}/acme/gated, then set HF_TOKEN (or --hf-token-file) to a token of an account "
        "that has access"
    )
    assert launch.output.count("is a gated model") == 1
    assert not launch.events()  # no shard or router ever started


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs (needs the right to mount: root, as in the CI container); skipped elsewhere."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    argv = ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)]
    mounted = subprocess.run(argv, capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_a_disk_that_fills_up_during_the_download_is_named(standin: HubStandin, small_filesystem: Path) -> None:
    """The listing understates the weights (4 MiB listed as 1 MiB), so the space check passes and the disk of a
    3 MiB filesystem fills up while they arrive, as when something else fills the volume meanwhile."""
    standin.add(synthetic_repo("acme/understated", listed_sizes={"model.safetensors": 1024 * 1024}))
    result = run_download(small_filesystem, standin.url, "acme/understated")
    assert result.returncode == 1
    assert last_line(result).endswith(
        f"the disk filled up while downloading acme/understated into {small_filesystem / 'hub'} (no space left on "
        "device): free some space or give the cache a larger volume (HF_HOME or HF_HUB_CACHE; in the Helm chart, "
        "modelCache.size); the files already complete are kept"
    )
    snapshot = snapshot_of(small_filesystem, "acme/understated")
    assert "config.json" in os.listdir(snapshot) and "model.safetensors" not in os.listdir(snapshot)
    assert not list((snapshot.parents[1] / "blobs").glob("*.incomplete"))


def test_a_full_disk_is_named_wherever_it_happens(standin: HubStandin, tmp_path: Path, monkeypatch) -> None:
    """The same message without a small filesystem: the write of the weights fails with ENOSPC."""
    import errno  # noqa: PLC0415

    from huggingface_hub import file_download  # noqa: PLC0415
    from tandem_launcher.hub import fetch_snapshot  # noqa: PLC0415
    from tandem_launcher.hub_errors import HubError  # noqa: PLC0415
    from tandem_launcher.hub_request import HubRequest  # noqa: PLC0415
    from tandem_launcher.progress import DownloadProgress  # noqa: PLC0415

    def full(url: str, temp_file, **kwargs) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_download, "http_get", full)
    # In this process HF_ENDPOINT is not the stand-in: keep huggingface_hub's agent-registry fetch off the network.
    monkeypatch.setattr("huggingface_hub.utils._detect_agent._fetch_registry", lambda: None)
    request = HubRequest("acme/tiny", endpoint=standin.url)
    with pytest.raises(
        HubError, match=r"^the disk filled up while downloading acme/tiny into .*/cache \(no space left"
    ):
        fetch_snapshot(request, tmp_path / "cache", DownloadProgress)
