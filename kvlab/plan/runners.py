"""Where the evaluations run: in this process, on every core (a process pool), or as Ray
tasks on a local or existing Ray cluster. Each evaluates the same function on the same
inputs, and the search orders results by design, never by completion, so every runner
gives the same table.

Ray is optional (`pip install kvlab[ray]`) and imported only by `run_ray`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from ..errors import KvlabError
from .evaluate import saturation_of

_SHARED: dict = {}


def evaluate(design, job, traces) -> dict:
    """The unit of work every runner runs: one design's saturation search."""
    return saturation_of(design, job, traces)


def run_serial(designs, job, traces, on_result) -> None:
    for d in designs:
        on_result(d, evaluate(d, job, traces))


def cores() -> int:
    """Cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def start_method():
    """The multiprocessing context of kvlab's process pools: 'forkserver' where the platform
    has it, else 'spawn' (never fork: a forked child would inherit whatever threads the
    parent runs, a notebook kernel's included)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _init_worker(job, traces) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    _SHARED["job"], _SHARED["traces"] = job, traces


def _evaluate_in_worker(design) -> dict:
    return evaluate(design, _SHARED["job"], _SHARED["traces"])


def run_pool(designs, job, traces, on_result, workers: int | None = None) -> None:
    """A process pool of `workers` (default: every core), started by `start_method`. The
    job and traces travel once per worker."""
    workers = min(workers or cores(), len(designs))
    if workers <= 1:
        return run_serial(designs, job, traces, on_result)
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=start_method(),
        initializer=_init_worker,
        initargs=(job, traces),
    )
    try:
        futures = {pool.submit(_evaluate_in_worker, d): d for d in designs}
        for future in as_completed(futures):
            on_result(futures[future], future.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _evaluate_shared(shared, design) -> dict:
    job, traces = shared
    return evaluate(design, job, traces)


def run_ray(designs, job, traces, on_result, address: str | None = None) -> None:
    """The same evaluations as Ray tasks (one CPU each). Uses the Ray session already
    started in this process if there is one; else `ray.init()` starts a local one, or
    `ray.init(address=...)` joins a cluster (kvlab's code is shipped with the job, so the
    cluster only needs Ray and numpy). The job and traces go to the object store once."""
    try:
        import ray
    except ImportError:
        raise KvlabError(
            "--ray needs Ray: pip install 'kvlab[ray]' (or the ray version in requirements.txt)"
        ) from None
    started = False
    if not ray.is_initialized():
        kwargs = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        if address:
            package = str(Path(__file__).resolve().parents[1])
            kwargs["runtime_env"] = {"py_modules": [package]}
            try:
                ray.init(address=address, **kwargs)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise KvlabError(f"--ray {address}: cannot join that Ray cluster: {exc}") from None
        else:
            ray.init(**kwargs)
        started = True
    pending: dict = {}
    try:
        shared = ray.put((job, traces))
        task = ray.remote(num_cpus=1)(_evaluate_shared)
        pending = {task.remote(shared, d): d for d in designs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            design = pending.pop(done[0])
            on_result(design, ray.get(done[0]))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()
