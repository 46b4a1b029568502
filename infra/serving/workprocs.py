"""Worker processes for the pieces of work that would hold a server's interpreter lock.

Most of a server's costly work runs in C and lets the interpreter lock go (decoding, model
inference, large array arithmetic); some does not: a metric's Markov chain (IRT) steps
through thousands of small numpy operations, each too small to release the lock. While such
a piece runs, every other thread of the process -- another tenant's control call, an
evaluation's bookkeeping -- waits for the lock at each of its own steps (up to the
interpreter's switch interval, 5 ms, each time), so a tenant's long computation slowed every
other tenant's evaluation by a third (docs/benchmarks.md, "Noisy neighbour"). The work share
(workshare.py) already bounds how many such pieces a tenant runs and at what rate; here they
run in processes of their own, each with its own lock.

:class:`PieceProcesses` keeps up to ``processes`` worker processes (each a fresh interpreter
with the server's import path that imports the modules the pieces need: ~0.25 s here, once
per worker), at a lower scheduling priority than the server's threads (as the share's
threads are). ``call``
sends a module-level function and its arguments (pickled) to an idle worker and waits for
its answer, looking at ``should_stop`` meanwhile: when the caller's deadline passes or the
call is cancelled the worker is killed (the computation really stops; a new worker takes its
place on the next call) and what ``should_stop`` raised is raised. An error the piece
raises comes back as the same class (Fortis's errors pickle with their fields); a worker
that dies (killed by the kernel for memory, a crash) is an ``Internal`` error for that call
only. Workers end when the server closes the pool, or on their own when it is gone.

Pure Python, no gRPC.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fortis.infra.serving.workshare import WORK_NICE
from fortis.services.common import errors

__all__ = ["PieceProcesses"]

T = TypeVar("T")

#: How often a waiting caller looks at its deadline (seconds).
_POLL_S = 0.05

#: What a worker interpreter runs: the server's import path, then :func:`_worker_main`.
_BOOTSTRAP = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
              "from fortis.infra.serving.workprocs import _worker_entry; _worker_entry()")


def _worker_entry() -> None:
    """argv: the import path (JSON), the socket's descriptor, the nice value to run at (an
    absolute value: the server thread that starts a worker may already run lower), then the
    modules to import before the first piece."""
    fd, priority, preload = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the server decides when workers end
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, priority)
    for name in preload:
        importlib.import_module(name)
    _worker_main(multiprocessing.connection.Connection(fd))


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    """A worker's loop: (function, args, kwargs) in, ("ok", value) or ("err", exception) out,
    until the socket closes (the server ended or let the worker go)."""
    while True:
        try:
            fn, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller
            answer = ("err", exc)
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - an answer or error that does not pickle
            conn.send(("err", errors.Internal(
                f"a worker's answer could not be sent back: {type(exc).__name__}")))


def _ended(w: _Worker) -> errors.Internal:
    with contextlib.suppress(subprocess.TimeoutExpired):
        w.process.wait(5)
    code = w.process.returncode
    how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return errors.Internal(f"the worker process running this computation ended ({how})")


@dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    conn: multiprocessing.connection.Connection

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.process.wait(5)
        with contextlib.suppress(Exception):
            self.conn.close()


class PieceProcesses:
    """See the module docstring. ``preload``: modules each worker imports as it starts (those
    of the functions it will be sent), so its first piece does not wait for them; ``nice``:
    how much lower than the server's main thread the workers run (the work share's own)."""

    def __init__(self, processes: int, *, preload: Sequence[str] = (),
                 nice: int = WORK_NICE) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self.processes = processes
        self._nice = nice
        self._preload = list(dict.fromkeys(preload))
        self._lock = threading.Condition()
        self._idle: list[_Worker] = []
        self._started = 0
        self._closed = False

    def _start(self) -> _Worker:
        try:    # the server's main thread's priority (this thread may run lower already)
            priority = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + self._nice)
        except (OSError, AttributeError):
            priority = self._nice
        ours, theirs = socket.socketpair()
        try:
            # A fresh interpreter with this one's import path (-P: not the working folder's),
            # never this process's __main__: a server started from a script or a notebook
            # must not have its top level run again in every worker.
            proc = subprocess.Popen(
                [sys.executable, "-P", "-c", _BOOTSTRAP, json.dumps(sys.path),
                 str(theirs.fileno()), str(priority), *self._preload],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return _Worker(proc, multiprocessing.connection.Connection(ours.detach()))

    def _take(self, should_stop: Callable[[], Any] | None) -> _Worker:
        with self._lock:
            while True:
                if self._closed:
                    raise errors.Unavailable("the server is shutting down")
                while self._idle:
                    w = self._idle.pop()
                    if w.alive():
                        return w
                    w.kill()
                    self._started -= 1
                if self._started < self.processes:
                    self._started += 1
                    break
                self._lock.wait(_POLL_S)
                if should_stop is not None:
                    should_stop()
        try:
            return self._start()
        except BaseException:
            with self._lock:
                self._started -= 1
                self._lock.notify()
            raise

    def _give_back(self, w: _Worker, keep: bool) -> None:
        """``w`` back to the idle ones (``keep``), else ended and its place freed. Ending a
        worker waits for its process (up to seconds for one slow to die): done outside the
        lock, so other calls take and give back workers meanwhile; its place is freed only
        once it is gone, so no more than ``processes`` ever run."""
        with self._lock:
            if keep and not self._closed:
                self._idle.append(w)
                self._lock.notify()
                return
        w.kill()
        with self._lock:
            self._started -= 1
            self._lock.notify()

    def call(self, fn: Callable[..., T], *args: Any,
             should_stop: Callable[[], Any] | None = None, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker process (``fn`` a module-level function, its
        arguments and answer picklable). ``should_stop`` is called while waiting; what it
        raises kills the worker and is raised here."""
        w = self._take(should_stop)
        answered = False
        try:
            w.conn.send((fn, args, kwargs))
            while not w.conn.poll(_POLL_S):
                if should_stop is not None:
                    should_stop()       # what it raises ends the worker below
                if not w.alive():
                    raise _ended(w)
            try:
                status, value = w.conn.recv()
            except (EOFError, OSError):     # it died as it answered, or before
                raise _ended(w) from None
            answered = True
        finally:
            self._give_back(w, keep=answered)
        if status == "err":
            raise value
        return value  # type: ignore[no-any-return]

    def close(self) -> None:
        """End the idle workers now and each busy one when its piece ends; later calls are
        refused (``Unavailable``)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._lock.notify_all()
        for w in idle:
            w.kill()
