"""Downloads the Hub or the disk refuses, against a Hub stand-in served over HTTP: each message names the cause and what
to do, and nothing is fetched that the refusal forbids."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_download_testing import (
    GOOD_TOKEN,
    NO_ACCESS_TOKEN,
    closed_port_url,
    last_line,
    point_launcher_at,
    run_download,
    snapshot_of,
    standin_with_repos,
)
from hub_standin import HubStandin
from hub_standin_repos import synthetic_repo


@pytest.fixture(scope="module")
def standin() -> Iterator[HubStandin]:
    with standin_with_repos() as hub:
        yield hub


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


def test_the_launcher_ends_with_the_download_error_as_its_last_line(
    standin: HubStandin, tmp_path: Path, launch_fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_launcher_at(monkeypatch, tmp_path / "hf", standin.url)
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
    repo = synthetic_repo("acme/understated", listed_sizes={"model.safetensors": 1024 * 1024})
    standin.add(repo)
    result = run_download(small_filesystem, standin.url, "acme/understated")
    assert result.returncode == 1
    assert last_line(result).endswith(
        f"the disk filled up while downloading acme/understated into {small_filesystem / 'hub'} (no space left on "
        "device): free some space or give the cache a larger volume (HF_HOME or HF_HUB_CACHE; in the Helm chart, "
        "modelCache.size); the files already complete are kept"
    )
    snapshot = snapshot_of(small_filesystem, "acme/understated")
    kept = os.listdir(snapshot)
    # Files download in parallel, so which small ones finished before the disk filled varies: each kept one is
    # whole, and the weights that filled the disk are not kept.
    assert "model.safetensors" not in kept
    assert all((snapshot / name).read_bytes() == repo.files[name] for name in kept)
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
