"""LoRA adapters on the launcher's command line: TGI's `--lora-adapters` and vLLM's `--lora-modules` forms, each
adapter a local PEFT directory or a Hub repo id (fetched from a stand-in served over HTTP), handed to every shard as
`--lora-adapter NAME=DIR` with the shards' bounds."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_download_testing import last_line, point_launcher_at, run_download, snapshot_of
from hub_standin import HubStandin
from hub_standin_repos import StandinRepo
from tandem_launcher.cli import parse_config
from tandem_launcher.config import LauncherConfig
from tandem_launcher.lora_adapters import AdapterSpec
from tandem_launcher.model_resolution import ModelResolutionError, resolve_configured_model

ADAPTER_CONFIG = json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}).encode()


def write_adapter(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_bytes(ADAPTER_CONFIG)
    (directory / "adapter_model.safetensors").write_bytes(b"weights")
    return directory


@pytest.fixture(scope="module")
def standin() -> Iterator[HubStandin]:
    hub = HubStandin()
    files = {"adapter_config.json": ADAPTER_CONFIG, "adapter_model.safetensors": b"weights", "README.md": b"#"}
    hub.add(StandinRepo("acme/sql-lora", files))
    hub.add(StandinRepo("acme/not-an-adapter", {"README.md": b"#"}))
    with hub:
        yield hub


def test_both_flag_forms_name_adapters_and_bound_the_shards() -> None:
    config = parse_config(
        [
            "--lora-adapters", "acme/sql-lora, chat=/adapters/chat",
            "--lora-modules", "a=/p", '{"name": "b", "path": "org/b"}',
            "--max-loras", "2",
        ],
        {},
    )  # fmt: skip
    assert config.lora_adapters == (
        AdapterSpec("acme/sql-lora", "acme/sql-lora"),
        AdapterSpec("chat", "/adapters/chat"),
        AdapterSpec("a", "/p"),
        AdapterSpec("b", "org/b"),
    )
    assert (config.forwarded["max_loras"], config.forwarded["max_lora_rank"]) == (2, 64)
    from_env = parse_config([], {"LORA_ADAPTERS": "x=/x,y=/y"})
    assert [spec.name for spec in from_env.lora_adapters] == ["x", "y"]
    assert from_env.forwarded["max_loras"] == 4


def test_without_adapters_the_shards_keep_no_adapter_slots_unless_runtime_loading_is_allowed() -> None:
    assert parse_config([], {}).forwarded["max_loras"] == 0
    assert parse_config(["--allow-runtime-lora-updating"], {}).forwarded["max_loras"] == 4
    assert parse_config(["--max-loras", "1"], {}).forwarded["max_loras"] == 1
    assert parse_config([], {}).forwarded["max_cpu_loras"] is None
    assert parse_config(["--max-cpu-loras", "8"], {}).forwarded["max_cpu_loras"] == 8


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora-modules", "no-equals"], "not NAME=PATH_OR_REPO"),
        (["--lora-modules", '{"path": "/p"}'], 'needs "name" and "path"'),
        (["--lora-adapters", "bad name=/p"], "not an adapter NAME=PATH_OR_REPO"),
        (["--lora-adapters", "a=/p", "--lora-modules", "a=/q"], "name 'a' is given more than once"),
        (["--max-loras", "-1"], "--max-loras must not be negative"),
        (["--max-cpu-loras", "0"], "--max-cpu-loras must be positive"),
        (["--lora-adapters", "a=/p", "--max-cpu-loras", "3"], "--max-cpu-loras 3 is below --max-loras 4"),
    ],
)
def test_malformed_adapter_flags_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_config(argv, {})
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_local_adapter_directory_is_used_as_it_is_and_an_incomplete_one_is_named(
    model_dir: Path, tmp_path: Path
) -> None:
    adapter = write_adapter(tmp_path / "sql")
    config = LauncherConfig(model_id=str(model_dir), lora_adapters=(AdapterSpec("sql", str(adapter)),))
    assert resolve_configured_model(config).lora_adapters == (("sql", adapter.resolve()),)
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(ModelResolutionError, match=r"LoRA adapter 'sql': .* lacks adapter_model\.safetensors"):
        resolve_configured_model(config)
    absent = LauncherConfig(model_id=str(model_dir), lora_adapters=(AdapterSpec("x", str(tmp_path / "absent")),))
    with pytest.raises(ModelResolutionError, match=r"LoRA adapter 'x': no such directory"):
        resolve_configured_model(absent)


def test_hub_adapters_are_fetched_and_every_shard_gets_each_adapter_and_the_bounds(
    standin: HubStandin, tmp_path: Path, launch_fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_launcher_at(monkeypatch, tmp_path / "hf", standin.url)
    local = write_adapter(tmp_path / "chat")
    launch = launch_fakes(
        num_shard=2, lora_adapters=[["sql", "acme/sql-lora"], ["chat", str(local)]], max_loras=3, max_cpu_loras=5
    )
    launch.wait_for_output("Tandem is ready")
    snapshot = snapshot_of(tmp_path / "hf", "acme/sql-lora")
    assert (snapshot / "adapter_model.safetensors").read_bytes() == b"weights"
    shard_argvs = [event for event in launch.events() if " argv " in event and event.startswith("shard-")]
    assert len(shard_argvs) == 2
    for argv in shard_argvs:
        assert f"--lora-adapter sql={snapshot} --lora-adapter chat={local.resolve()}" in argv
        assert "--max-loras 3 --max-lora-rank 64 --max-cpu-loras 5" in argv
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0


def test_a_hub_repo_without_adapter_files_fails_the_start_naming_the_adapter(
    standin: HubStandin, tmp_path: Path, launch_fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_launcher_at(monkeypatch, tmp_path / "hf", standin.url)
    launch = launch_fakes(lora_adapters=[["sql", "acme/not-an-adapter"]])
    assert launch.finish() != 0
    assert "LoRA adapter 'sql'" in launch.output
    assert "adapter_config.json" in launch.output


def test_download_fetches_the_adapters_beside_the_model(standin: HubStandin, model_dir: Path, tmp_path: Path) -> None:
    served = run_download(tmp_path, standin.url, str(model_dir), "--lora-adapters", "sql=acme/sql-lora")
    assert served.returncode == 0, served.stderr
    snapshot = snapshot_of(tmp_path, "acme/sql-lora")
    assert f"LoRA adapter sql is ready to serve from {snapshot}" in served.stderr
    missing = run_download(tmp_path, standin.url, str(model_dir), "--lora-adapters", "x=acme/not-an-adapter")
    assert missing.returncode == 1
    assert "LoRA adapter 'x'" in last_line(missing)
