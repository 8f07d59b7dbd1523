"""Runs a command that dies with the launcher: `python -m tandem_launcher.orphan_guard LAUNCHER_PID -- ARGV...`.

The kernel's parent-death signal is armed here, in a fresh single-threaded interpreter, and survives `exec`. Arming
it between `fork` and `exec` of the launcher itself (subprocess's `preexec_fn`) forks a process that runs other
threads' fork handlers and can block forever on locks those threads held: gRPC's wait for its own threads, for one.
Without `preexec_fn`, subprocess starts the child with `vfork`, which runs no handlers.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1
_SEPARATOR = "--"


def guarded_argv(argv: Sequence[str], launcher_pid: int | None = None) -> list[str]:
    """`argv` wrapped so that its process is SIGKILLed when the launcher (this process by default) dies."""
    pid = os.getpid() if launcher_pid is None else launcher_pid
    return [sys.executable, "-m", __name__, str(pid), _SEPARATOR, *argv]


def main(args: Sequence[str]) -> None:
    if len(args) < 3 or args[1] != _SEPARATOR or not args[0].isdigit():
        sys.exit(f"usage: python -m {__name__} LAUNCHER_PID -- ARGV...")
    launcher_pid, argv = int(args[0]), list(args[2:])
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # A launcher that died before the signal was armed left this process to another parent: it dies at once.
    if os.getppid() != launcher_pid:
        signal.raise_signal(signal.SIGKILL)
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        sys.exit(f"cannot start {argv[0]}: {error}")


if __name__ == "__main__":
    main(sys.argv[1:])
