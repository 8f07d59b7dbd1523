"""One child process: spawned with explicit argv, its output forwarded with a prefix, stopped in steps."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from tandem_launcher.orphan_guard import guarded_argv

TAIL_LINES = 50


LineSink = Callable[[str, str], None]


class ChildProcess:
    """A supervised child; keeps its last output lines for error reports."""

    def __init__(self, name: str, process: subprocess.Popen[str], sink: LineSink) -> None:
        self.name = name
        self._process = process
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._tail_lock = threading.Lock()
        self._reader = threading.Thread(target=self._forward, args=(sink,), name=f"{name}-output", daemon=True)
        self._reader.start()

    @classmethod
    def spawn(
        cls, name: str, argv: Sequence[str], sink: LineSink, environment: Mapping[str, str] | None = None
    ) -> ChildProcess:
        """Starts `argv` in its own session (a Ctrl-C reaches only the launcher; the group can be killed whole), with
        `environment` instead of the launcher's when given. The kernel kills it if the launcher dies, even by
        SIGKILL (see `orphan_guard`)."""
        if shutil.which(argv[0]) is None:
            raise ChildStartError(name, argv, FileNotFoundError(f"no such program: {argv[0]}"))
        try:
            process = subprocess.Popen(
                guarded_argv(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
                start_new_session=True,
                env=None if environment is None else dict(environment),
            )
        except OSError as error:
            raise ChildStartError(name, argv, error) from error
        return cls(name, process, sink)

    @property
    def pid(self) -> int:
        return self._process.pid

    def _forward(self, sink: LineSink) -> None:
        assert self._process.stdout is not None
        for raw in self._process.stdout:
            line = raw.rstrip("\r\n")
            with self._tail_lock:
                self._tail.append(line)
            sink(self.name, line)

    def poll(self) -> int | None:
        """The exit status once the child has exited, else None."""
        return self._process.poll()

    def tail(self) -> list[str]:
        """The last lines the child printed, complete once it has exited."""
        if self._process.poll() is not None:
            self._reader.join(timeout=2.0)
        with self._tail_lock:
            return list(self._tail)

    def signal(self, signum: signal.Signals) -> None:
        """Sends `signum` unless the child is already gone."""
        if self._process.poll() is None:
            try:
                self._process.send_signal(signum)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> int | None:
        """Waits up to `timeout` seconds; the exit status, or None if still running."""
        try:
            return self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> int:
        """SIGKILL the child and its process group, then reap."""
        self.signal(signal.SIGKILL)
        status = self._process.wait()
        self.kill_group()
        return status

    def kill_group(self) -> None:
        """SIGKILLs whatever the child left in its process group (its own children)."""
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class ChildStartError(Exception):
    """A child's program could not be started at all."""

    def __init__(self, name: str, argv: Sequence[str], error: OSError) -> None:
        super().__init__(f"cannot start {name} ({argv[0]}): {error}")


def stop_children(children: Sequence[ChildProcess], timeout: float) -> dict[str, int]:
    """SIGTERM all of `children` at once, SIGKILL whatever outlives `timeout`; their exit statuses."""
    for child in children:
        child.signal(signal.SIGTERM)
    statuses: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    for child in children:
        status = child.wait(max(0.0, deadline - time.monotonic()))
        statuses[child.name] = child.kill() if status is None else status
        child.kill_group()
        child.tail()  # joins the output reader, so the child's last lines precede its exit status
    return statuses
