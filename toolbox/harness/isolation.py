"""Running one case in a child process with a timeout, so a crash or a hang costs only that case.

The child re-imports the implementation by its `module:function` path and loads the contract by
path (with "fork" both are usually already in memory). CPU cases fork (cheap); CUDA cases spawn,
since CUDA cannot be used in a forked child of a process that touched it.
"""

from __future__ import annotations

import multiprocessing
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


def _child(job: Job, connection) -> None:
    try:
        outcome = run_job_inline(job)
    except BaseException as error:  # anything that escaped the per-case handling
        outcome = Outcome(Status.RUNTIME_ERROR, f"harness error: {last_line(error)}")
    connection.send(outcome)
    connection.close()


def run_job_isolated(job: Job, timeout_s: float) -> Outcome:
    """The job in a child process; TIMEOUT after `timeout_s`, RUNTIME_ERROR when the child dies without a result."""
    method = "spawn" if job.device == "cuda" else "fork"
    context = multiprocessing.get_context(method)
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(job, sender), daemon=True)
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
