"""Process supervision for the devices that run as child processes (a binary, the torch_npu child):
spawn a run in its own process group, stop it on a timeout or Ctrl-C, and keep its logs capped.

Each run starts a new session, so the run and everything it starts form one process group: a timeout,
Ctrl-C or the end of the run kills the whole group. Its stdout and stderr go through pipes into logs that
keep their first and last MiB.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import STATUS_FILE, Attempt, Execution

#: Seconds between SIGTERM and SIGKILL when a process group is stopped.
KILL_GRACE_S = 2.0

LOG_HEAD_BYTES = 1 << 20
#: A binary's stdout and stderr logs keep their first and last MiB; what lies between is cut (and counted).
LOG_TAIL_BYTES = 1 << 20

#: Seconds to keep reading a binary's output after its process group ended (a descendant that left the
#: group may hold the pipe open).
PIPE_DRAIN_S = 2.0


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a run's whole process group: SIGTERM, then SIGKILL after KILL_GRACE_S."""
    signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def spawn(attempt: Attempt, execution: Execution) -> None:
    """Run `attempt.argv` in its own process group, its output into capped logs, until it exits, runs past
    the time limit, or the run is cancelled; record how it ended in `attempt`."""
    env = {**os.environ, **execution.env}
    deadline = None if execution.timeout is None else time.monotonic() + execution.timeout
    with (
        CappedLog(execution.output_dir / attempt.stdout_log) as out,
        CappedLog(execution.output_dir / attempt.stderr_log) as err,
    ):
        try:
            proc = subprocess.Popen(
                attempt.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            attempt.problems.append(f"cannot start {attempt.argv[0]}: {exc.strerror or exc}")
            return
        execution.cancel.add(proc.pid)
        assert proc.stdout is not None and proc.stderr is not None
        reader = PipeReader({proc.stdout: out, proc.stderr: err})
        try:
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.05)
                    break
                cancelled = execution.cancel.event.is_set()
                if cancelled or (deadline is not None and time.monotonic() > deadline):
                    attempt.interrupted, attempt.timed_out = cancelled, not cancelled
                    stop_group(proc)
                    break
        finally:
            # Children the binary left behind belong to the run: stop them too.
            signal_group(proc.pid, signal.SIGKILL)
            execution.cancel.discard(proc.pid)
            reader.finish(PIPE_DRAIN_S)
    code = proc.returncode  # set: the process was waited for
    if code < 0 and execution.cancel.event.is_set() and not attempt.timed_out:
        attempt.interrupted = True  # killed by the Ctrl-C handler before this worker saw the flag
    stopped = attempt.timed_out or attempt.interrupted
    if code < 0 and not stopped:
        attempt.signal = signal_name(-code)
    elif code >= 0:
        attempt.exit_code = code
        if code != 0 and not stopped:
            wrote = (attempt.staging / STATUS_FILE).is_file()
            hint = " although it wrote status.txt (exit 0 once the status is recorded)" if wrote else ""
            attempt.problems.append(f"exited with code {code}{hint} (see {attempt.stderr_log})")


class CappedLog:
    """A log file that keeps the first LOG_HEAD_BYTES and the last LOG_TAIL_BYTES written to it and says,
    between them, how many bytes were cut."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "wb")  # noqa: SIM115 - closed in __exit__
        self.head = 0
        self.tail = bytearray()
        self.cut = 0

    def __enter__(self) -> CappedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.cut:
                self.file.write(
                    f"\n[bsa: {self.cut} bytes cut here; a log keeps its first {LOG_HEAD_BYTES} and last "
                    f"{LOG_TAIL_BYTES} bytes]\n".encode()
                )
            self.file.write(self.tail)
        finally:
            self.file.close()

    def write(self, data: bytes) -> None:
        try:
            head = data[: max(0, LOG_HEAD_BYTES - self.head)]
            self.file.write(head)
            self.head += len(head)
            self.tail += data[len(head) :]
            extra = max(0, len(self.tail) - LOG_TAIL_BYTES)
            del self.tail[:extra]
            self.cut += extra
        except OSError:  # a full disk: the rest of the output is read and dropped, so the child never blocks
            self.cut += len(data)


class PipeReader(threading.Thread):
    """Copies a child's stdout and stderr pipes into capped logs until both close or `finish` stops it."""

    def __init__(self, pipes: Mapping[Any, CappedLog]) -> None:
        super().__init__(daemon=True, name="bsa-logs")
        self.pipes = dict(pipes)
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for pipe, log in self.pipes.items():
                selector.register(pipe, selectors.EVENT_READ, log)
            while selector.get_map() and not self.stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    try:
                        data = os.read(key.fd, 1 << 16)
                    except OSError:
                        data = b""
                    if data:
                        key.data.write(data)
                    else:
                        selector.unregister(key.fileobj)

    def finish(self, timeout: float) -> None:
        """Wait up to `timeout` s for the pipes to close (the process group is gone), then stop reading."""
        self.join(timeout)
        self.stop.set()
        self.join()
        for pipe in self.pipes:
            pipe.close()
