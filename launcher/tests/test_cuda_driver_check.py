"""`--device auto` on a machine with an NVIDIA GPU: cuda when torch can use it, a loud error when it cannot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tandem_launcher.cli import parse_config
from tandem_launcher.gpus import (
    CudaUnusableError,
    NvidiaProbe,
    TorchCuda,
    resolve_device,
    visible_cuda_devices,
)

PROPRIETARY_R550 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024\n"
OPEN_R580 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22-I3-AE18-09-3)"
    "  Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)


def machine(root: Path, version_file: str | None = None, device_nodes: tuple[str, ...] = ()) -> NvidiaProbe:
    """A stand-in for /proc/driver/nvidia/version and /dev under `root`."""
    (root / "dev").mkdir()
    for node in device_nodes:
        (root / "dev" / node).touch()
    if version_file is not None:
        (root / "version").write_text(version_file)
    return NvidiaProbe(driver_version_file=root / "version", device_dir=root / "dev")


def torch_with(device_count: int, cuda: str | None = "13.2") -> Callable[[], TorchCuda]:
    return lambda: TorchCuda(device_count, cuda)


def never_imported() -> TorchCuda:
    raise AssertionError("torch must not be imported on a machine without an NVIDIA device")


def unusable_error(probe: NvidiaProbe, torch_cuda: Callable[[], TorchCuda], environ: dict[str, str]) -> str:
    with pytest.raises(CudaUnusableError) as raised:
        resolve_device("auto", lambda: visible_cuda_devices(environ, probe, torch_cuda))
    return str(raised.value)


def test_machine_without_nvidia_device_serves_on_cpu_without_asking_torch(tmp_path: Path) -> None:
    probe = machine(tmp_path, device_nodes=("null", "nvidiactl-not-a-gpu"))
    assert resolve_device("auto", lambda: visible_cuda_devices({}, probe, never_imported)) == "cpu"


def test_container_without_gpus_on_a_gpu_host_serves_on_cpu(tmp_path: Path) -> None:
    # The host's /proc/driver/nvidia shows through; no device node was passed in.
    probe = machine(tmp_path, OPEN_R580, device_nodes=("null",))
    assert resolve_device("auto", lambda: visible_cuda_devices({}, probe, never_imported)) == "cpu"


@pytest.mark.parametrize(
    ("version_file", "device_nodes"),
    [(OPEN_R580, ("nvidiactl",)), (None, ("nvidia0", "nvidia1", "nvidiactl")), (OPEN_R580, ("nvidia0",))],
)
def test_nvidia_device_that_torch_can_use_makes_auto_cuda(
    tmp_path: Path, version_file: str | None, device_nodes: tuple[str, ...]
) -> None:
    probe = machine(tmp_path, version_file, device_nodes)
    assert visible_cuda_devices({}, probe, torch_with(2)) == 2
    assert resolve_device("auto", lambda: visible_cuda_devices({}, probe, torch_with(2))) == "cuda"


def test_driver_older_than_torchs_cuda_needs_names_driver_cuda_minimum_and_ways_out(tmp_path: Path) -> None:
    message = unusable_error(machine(tmp_path, PROPRIETARY_R550, ("nvidia0",)), torch_with(0, "13.2"), {})
    assert "driver 550.127.05" in message
    assert "CUDA 13.2" in message
    assert ">= 580.65.06" in message
    assert "R580 or newer" in message
    assert "--device cpu" in message


def test_device_node_without_driver_version_file_still_fails_and_says_the_version_is_unknown(tmp_path: Path) -> None:
    message = unusable_error(machine(tmp_path, None, ("nvidia0",)), torch_with(0, "13.2"), {})
    assert "driver version unknown" in message
    assert ">= 580.65.06" in message
    assert "--device cpu" in message


def test_new_enough_driver_that_torch_cannot_use_points_at_device_access(tmp_path: Path) -> None:
    message = unusable_error(machine(tmp_path, OPEN_R580, ("nvidiactl",)), torch_with(0, "13.2"), {})
    assert "driver 580.95.05" in message
    assert "/dev/nvidia*" in message
    assert "install a driver" not in message
    assert "--device cpu" in message


def test_cpu_only_torch_on_a_gpu_machine_is_named_as_such(tmp_path: Path) -> None:
    message = unusable_error(machine(tmp_path, OPEN_R580, ("nvidia0",)), torch_with(0, None), {})
    assert "CPU-only build" in message
    assert "torch.version.cuda is None" in message
    assert "--device cpu" in message


def test_torch_of_a_cuda_major_without_known_minimum_driver_still_fails_loudly(tmp_path: Path) -> None:
    message = unusable_error(machine(tmp_path, PROPRIETARY_R550, ("nvidia0",)), torch_with(0, "14.0"), {})
    assert "CUDA 14.0" in message
    assert "--device cpu" in message


@pytest.mark.parametrize("hidden", ["", "-1", " -1,0"])
def test_gpus_hidden_on_purpose_serve_on_cpu(tmp_path: Path, hidden: str) -> None:
    probe = machine(tmp_path, OPEN_R580, ("nvidia0",))
    environ = {"CUDA_VISIBLE_DEVICES": hidden}
    assert resolve_device("auto", lambda: visible_cuda_devices(environ, probe, torch_with(0))) == "cpu"


def test_unusable_cuda_stops_the_launcher_with_the_reason_as_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    probe = machine(tmp_path, PROPRIETARY_R550, ("nvidia0",))
    with pytest.raises(SystemExit) as exited:
        parse_config([], {}, count_gpus=lambda: visible_cuda_devices({}, probe, torch_with(0, "13.2")))
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "driver 550.127.05" in error
    assert "--device cpu" in error


def test_explicit_cuda_device_with_unset_shard_count_stops_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    probe = machine(tmp_path, PROPRIETARY_R550, ("nvidia0",))
    with pytest.raises(SystemExit):
        parse_config(["--device", "cuda"], {}, count_gpus=lambda: visible_cuda_devices({}, probe, torch_with(0)))
    assert ">= 580.65.06" in capsys.readouterr().err
