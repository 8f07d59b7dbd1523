"""The draft model (`--speculative-model`) is resolved as the served model is, before any shard starts: a local
directory as it is, a .gguf file through the same converter, a repo id from the Hub (a stand-in served over HTTP) by
the launcher's own download step and by `tandem-launcher download`."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_download_testing import last_line, point_launcher_at, run_download, snapshot_of
from hub_standin import HubStandin
from hub_standin_repos import synthetic_repo
from tandem_launcher.config import LauncherConfig
from tandem_launcher.model_resolution import ModelResolutionError, resolve_configured_model

DRAFTING = {"speculate": 2, "speculative_method": "draft"}


@pytest.fixture(scope="module")
def standin() -> Iterator[HubStandin]:
    hub = HubStandin()
    hub.add(synthetic_repo("acme/served", weights_size=64 * 1024))
    hub.add(synthetic_repo("acme/draft", weights_size=32 * 1024))
    with hub:
        yield hub


def test_a_local_draft_directory_is_resolved_beside_the_served_model(model_dir: Path, tmp_path: Path) -> None:
    draft = shutil.copytree(model_dir, tmp_path / "draft")
    config = LauncherConfig(model_id=str(model_dir), speculative_model=str(draft), **DRAFTING)
    model = resolve_configured_model(config)
    assert (model.path, model.draft_path) == (model_dir.resolve(), draft.resolve())
    assert (model.served_name, model.max_position_embeddings) == (str(model_dir), 2048)
    assert resolve_configured_model(LauncherConfig(model_id=str(model_dir))).draft_path is None


@pytest.mark.parametrize(
    ("draft", "message"),
    [
        ("absent", r"draft model \(--speculative-model\): no such model directory"),
        ("incomplete", r"draft model \(--speculative-model\): model directory .*incomplete is missing tokenizer\.json"),
        ("fake.gguf", r"draft model \(--speculative-model\): .*fake\.gguf is not a GGUF file"),
    ],
)
def test_a_draft_model_that_cannot_be_served_is_named_in_the_error(
    model_dir: Path, tmp_path: Path, draft: str, message: str
) -> None:
    (tmp_path / "incomplete").mkdir()
    (tmp_path / "incomplete" / "config.json").write_text("{}")
    (tmp_path / "incomplete" / "model.safetensors").write_bytes(b"")
    (tmp_path / "fake.gguf").write_bytes(b"not a GGUF file")
    config = LauncherConfig(
        model_id=str(model_dir), speculative_model=str(tmp_path / draft), model_cache_dir=tmp_path / "c", **DRAFTING
    )
    with pytest.raises(ModelResolutionError, match=message):
        resolve_configured_model(config)


def test_download_fetches_the_draft_model_too_from_the_flag_or_its_variable(
    standin: HubStandin, tmp_path: Path
) -> None:
    flag = run_download(tmp_path / "flag", standin.url, "acme/served", "--speculative-model", "acme/draft")
    assert flag.returncode == 0, flag.stderr
    for repo_id in ("acme/served", "acme/draft"):
        snapshot = snapshot_of(tmp_path / "flag", repo_id)
        assert (snapshot / "model.safetensors").read_bytes() == standin.repos[repo_id].files["model.safetensors"]
        assert f"{repo_id} is ready to serve from {snapshot}" in flag.stderr
    env = run_download(tmp_path / "env", standin.url, "acme/served", env={"SPECULATIVE_MODEL": "acme/draft"})
    assert env.returncode == 0, env.stderr
    assert f"acme/draft is ready to serve from {snapshot_of(tmp_path / 'env', 'acme/draft')}" in env.stderr


def test_download_names_the_draft_model_when_it_cannot_be_fetched(standin: HubStandin, tmp_path: Path) -> None:
    missing = run_download(tmp_path, standin.url, "acme/served", "--speculative-model", "acme/absent")
    assert missing.returncode == 1
    assert f"draft model (--speculative-model): acme/absent was not found on {standin.url}" in last_line(missing)
    lone_revision = run_download(tmp_path, standin.url, "acme/served", "--speculative-model-revision", "v2")
    assert lone_revision.returncode == 2
    assert "--speculative-model-revision is the revision of a --speculative-model" in lone_revision.stderr


def test_the_launcher_downloads_a_missing_draft_model_and_every_shard_gets_it(
    standin: HubStandin, tmp_path: Path, launch_fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_launcher_at(monkeypatch, tmp_path / "hf", standin.url)
    # The served model's source variables are not the draft's: its download child must not read them.
    launch = launch_fakes(
        num_shard=2,
        speculative_model="acme/draft",
        model_cache_dir=str(tmp_path / "models"),
        environ={"REVISION": "v9", "GGUF_FILE": "served.Q4_0.gguf"},
        **DRAFTING,
    )
    launch.wait_for_output("Tandem is ready")
    snapshot = snapshot_of(tmp_path / "hf", "acme/draft")
    assert f"draft model directory: {snapshot}" in launch.output
    shard_argvs = [event for event in launch.events() if " argv " in event and event.startswith("shard-")]
    assert len(shard_argvs) == 2
    assert all(f"--draft-model-path {snapshot}" in argv for argv in shard_argvs)
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0
