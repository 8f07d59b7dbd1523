"""Defaults derived from the machine's GPUs: `--device auto` and an unset `--num-shard`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# The oldest Linux driver that runs every release of a CUDA major (minor version compatibility), and its branch.
MINIMUM_DRIVERS = {13: ("580.65.06", "R580"), 12: ("525.60.13", "R525")}
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..." or "... Open Kernel Module for x86_64  580.65.06 ..."
_KERNEL_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")
_WAY_OUT = "or pass --device cpu to serve on the CPU anyway"


class CudaUnusableError(ValueError):
    """An NVIDIA GPU is present but the installed torch cannot use it: serving would quietly fall back to the CPU."""


@dataclass(frozen=True)
class NvidiaProbe:
    """Where the NVIDIA driver shows itself; tests point both paths into a temporary directory."""

    driver_version_file: Path = Path("/proc/driver/nvidia/version")
    device_dir: Path = Path("/dev")

    def device_present(self) -> bool:
        """A GPU device node such as /dev/nvidia0, or the driver's control node. The version file alone is no proof:
        a container without GPUs on a GPU host still reads the host's /proc/driver/nvidia."""
        return (self.device_dir / "nvidiactl").exists() or any(self.device_dir.glob("nvidia[0-9]*"))

    def driver_version(self) -> str | None:
        """The loaded kernel module's version (e.g. 580.65.06); None when the version file is absent or unreadable."""
        try:
            match = _KERNEL_MODULE_VERSION.search(self.driver_version_file.read_text())
        except OSError:
            return None
        return match.group(1) if match else None


@dataclass(frozen=True)
class TorchCuda:
    """What the installed torch makes of CUDA on this machine."""

    device_count: int
    # torch.version.cuda: the CUDA torch was built for; None for a CPU-only build.
    version: str | None


DEFAULT_PROBE = NvidiaProbe()


def installed_torch_cuda() -> TorchCuda:
    """Asks the installed torch; slow to import, so only called where an NVIDIA device or a device list is present."""
    import torch  # noqa: PLC0415  (slow to import; CPU-only machines never pay for it)

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return TorchCuda(count, torch.version.cuda)


def visible_cuda_devices(
    environ: Mapping[str, str],
    probe: NvidiaProbe = DEFAULT_PROBE,
    torch_cuda: Callable[[], TorchCuda] = installed_torch_cuda,
) -> int:
    """CUDA devices the shards would see.

    Raises CudaUnusableError when an NVIDIA device is present but torch sees none, unless CUDA_VISIBLE_DEVICES hides
    every device on purpose.
    """
    present = probe.device_present()
    if not present and "CUDA_VISIBLE_DEVICES" not in environ:
        return 0
    cuda = torch_cuda()
    if present and cuda.device_count == 0 and not _hides_every_device(environ):
        raise CudaUnusableError(unusable_cuda_message(probe.driver_version(), cuda.version))
    return cuda.device_count


def unusable_cuda_message(driver: str | None, torch_cuda: str | None) -> str:
    """Why torch cannot use the NVIDIA device that is present, with the driver torch needs and the ways out."""
    found = f"driver {driver}" if driver else "driver version unknown"
    problem = f"an NVIDIA GPU is present ({found}) but torch cannot use CUDA"
    if torch_cuda is None:
        cpu_only = "the installed torch is a CPU-only build (torch.version.cuda is None)"
        return f"{problem}: {cpu_only}; install a CUDA build, {_WAY_OUT}"
    major = int(torch_cuda.split(".")[0])
    if major not in MINIMUM_DRIVERS:
        return f"{problem}: this torch is built for CUDA {torch_cuda}; install a driver that supports it, {_WAY_OUT}"
    minimum, branch = MINIMUM_DRIVERS[major]
    needs = f"this torch is built for CUDA {torch_cuda}, which needs an NVIDIA driver >= {minimum} ({branch} or newer)"
    if driver is not None and _release(driver) >= _release(minimum):
        access = "check that this process can open /dev/nvidia* (nvidia-smi)"
        return f"{problem}: {needs}, and {driver} is one; {access}, {_WAY_OUT}"
    return f"{problem}: {needs}; install a driver of branch {branch} or newer, {_WAY_OUT}"


def resolve_device(requested: str, count_gpus: Callable[[], int]) -> str:
    """`auto` is cuda when a GPU is visible, else cpu; cpu and cuda are kept."""
    if requested != "auto":
        return requested
    return "cuda" if count_gpus() > 0 else "cpu"


def resolve_num_shard(requested: int | None, device: str, count_gpus: Callable[[], int], nnodes: int = 1) -> int:
    """An unset `--num-shard` is one shard per visible GPU on CUDA and one shard on CPU, on each of `nnodes` nodes."""
    if requested is not None:
        return requested
    return (max(1, count_gpus()) if device == "cuda" else 1) * max(1, nnodes)


def _hides_every_device(environ: Mapping[str, str]) -> bool:
    # CUDA reads CUDA_VISIBLE_DEVICES up to its first invalid entry: "" or "-1" leaves torch no device.
    value = environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.split(",")[0].strip() in ("", "-1")


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())
