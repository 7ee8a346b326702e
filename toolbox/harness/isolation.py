"""Running one case in a child process with a timeout, so a crash or a hang costs only that case.

The child re-imports the implementation by its `module:function` path and loads the contract by
path (with "fork" both are usually already in memory). CPU cases fork a fresh child each (cheap).
CUDA cases run in a spawned worker (CUDA cannot be used in a forked child of a process that touched
it); since spawning re-imports torch and creates a CUDA context, one worker serves case after case
and is replaced after a timeout, a crash, or a faulted CUDA context.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from toolbox.harness.outcome import Outcome, last_line
from toolbox.harness.statuses import Status


@dataclass(frozen=True)
class Job:
    """Everything a child needs, as plain picklable data."""

    contract_path: str
    impl: str  # "package.module:function"
    kind: str  # "case" | "error"
    name: str
    device: str  # where it runs


def run_job_inline(job: Job) -> Outcome:
    """The job in this process (no isolation): for debugging and for fast tests."""
    from toolbox.harness.execution import execute
    from toolbox.harness.loading import import_function, load_contract

    try:
        loaded = load_contract(Path(job.contract_path))
        impl = import_function(job.impl)
    except Exception as error:  # a broken contract or implementation module is reported on its case
        return Outcome(Status.RUNTIME_ERROR, f"could not load: {last_line(error)}")
    return execute(loaded, job.kind, job.name, impl, device=job.device)


def _forked_child(job: Job, connection) -> None:
    """A forked child must not enter OpenMP parallel regions: GNU OpenMP's thread pool, once the parent
    has used it, does not survive fork, and the child would hang. One intra-op thread avoids it."""
    import torch

    torch.set_num_threads(1)
    _child(job, connection)


def _child(job: Job, connection, close: bool = True) -> None:
    try:
        outcome = run_job_inline(job)
    except Exception as error:  # anything that escaped the per-case handling
        outcome = Outcome(Status.RUNTIME_ERROR, f"harness error: {last_line(error)}")
    connection.send(outcome)
    if close:
        connection.close()


def _serve(connection) -> None:
    """A spawned worker's loop: run jobs until told to stop (None) or the parent goes away."""
    while True:
        try:
            job = connection.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        _child(job, connection, close=False)
        if job.device == "cuda" and not _cuda_healthy():
            os._exit(70)  # a faulted CUDA context poisons every later case: the parent starts a fresh worker


def _cuda_healthy() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
    except Exception:
        return False
    return True


class SpawnedWorker:
    """One spawned process reused for many jobs; `run` restarts it whenever it had to be killed or failed."""

    def __init__(self) -> None:
        self._process = None
        self._connection = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe(duplex=True)
        self._process = context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._connection = parent

    def stop(self) -> None:
        if self._process is None:
            return
        try:
            self._connection.send(None)
        except (OSError, BrokenPipeError):
            pass
        self._process.join(5)
        if self._process.is_alive():
            _kill(self._process)
        self._connection.close()
        self._process = self._connection = None

    def run(self, job: Job, timeout_s: float) -> Outcome:
        if self._process is None or not self._process.is_alive():
            self.stop()
            self._start()
        self._connection.send(job)
        if not self._connection.poll(timeout_s):
            _kill(self._process)
            self._process = None
            self._connection.close()
            return Outcome(Status.TIMEOUT, f"no result after {timeout_s:g} s; the worker process was killed", device=job.device)
        try:
            outcome = self._connection.recv()
        except (EOFError, OSError):
            self._process.join(5)
            code = self._process.exitcode
            self._process = None
            return Outcome(Status.RUNTIME_ERROR, f"the implementation crashed: {_exit_description(code)}", device=job.device)
        return outcome


_WORKERS: dict[str, SpawnedWorker] = {}


def stop_workers() -> None:
    for worker in _WORKERS.values():
        worker.stop()
    _WORKERS.clear()


def run_job_isolated(job: Job, timeout_s: float) -> Outcome:
    """The job in a child process; TIMEOUT after `timeout_s`, RUNTIME_ERROR when the child dies without a result."""
    if job.device == "cuda":
        return _WORKERS.setdefault("cuda", SpawnedWorker()).run(job, timeout_s)
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_forked_child, args=(job, sender), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout_s):
            _kill(process)
            return Outcome(Status.TIMEOUT, f"no result after {timeout_s:g} s; the child process was killed", device=job.device)
        try:
            outcome = receiver.recv()
        except (EOFError, OSError):
            process.join(5)
            return Outcome(Status.RUNTIME_ERROR, f"the implementation crashed: {_exit_description(process.exitcode)}", device=job.device)
    finally:
        receiver.close()
    process.join(5)
    if process.is_alive():
        _kill(process)
    return outcome


def _kill(process) -> None:
    process.kill()
    process.join(5)


def _exit_description(code: int | None) -> str:
    if code is None:
        return "the process did not exit"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"process exited with code {code} without a result"
