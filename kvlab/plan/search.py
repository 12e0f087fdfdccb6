"""The search: enumerate the designs, prune those that cannot fit, evaluate the rest where
the work runs, keep what finishes, rank.

    plan(job, workload, offers, space=Space(), prices=None, runner="local", ...) -> dict

The returned dict is JSON-ready and is what `kvlab plan --json` prints and what a chapter
precomputes and reads back (`load_plan`): `designs` ranked best first, `best`, `pareto`,
`pruned` (with reasons), `why`, and what the search was (`model`, `workload`, `slo`,
`space`, `gpus_offered`, `prices`). Everything but `wall_s`, `runner`, `evaluated` and
`reused` is the same whichever runner evaluated the designs and in whatever order they
finished.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..errors import KvlabError
from ..jsonsafe import jsonable
from . import rank, resume, runners
from .evaluate import Job
from .prune import prune_reason
from .space import Space, enumerate_designs
from .workload import Workload, digest

RUNNERS = ("local", "serial", "ray")


def job_fingerprint(job: Job, workload: Workload, traces) -> dict:
    """What a design's result depends on besides the design: a resume file must match it."""
    return resume.normalized(
        {"job": job.to_dict(), "workload": workload.to_dict(), "requests": digest(traces)}
    )


def plan(  # noqa: PLR0913 - one keyword per `kvlab plan` option
    job: Job,
    workload: Workload,
    offers: dict[str, int],
    space: Space | None = None,
    prices: dict | None = None,
    runner: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    resume_path=None,
    progress=None,
) -> dict:
    """Search the space; see the module docstring. `progress(done, total, best_row)` is
    called after each evaluation (best_row: the best design so far, a table row)."""
    started = time.perf_counter()
    space = space or Space()
    prices = dict(prices or {})
    if runner not in RUNNERS:
        raise KvlabError(f"unknown runner {runner!r}; valid: {', '.join(RUNNERS)}")
    traces = workload.traces()
    designs = enumerate_designs(space, offers)
    if not designs:
        offered = ", ".join(f"{n} x {hw}" for hw, n in offers.items())
        raise KvlabError(
            f"no design of the space fits in the GPUs on offer ({offered}): the smallest "
            f"needs {min(space.tensor_parallel)} GPU(s) per instance"
            + (
                ", and two instances to separate prefill from decode"
                if "colocated" not in space.archs
                else ""
            )
        )
    tokens = np.concatenate([t.input_tokens + t.output_tokens for t in traces])
    kept, pruned = [], []
    for d in designs:
        why = prune_reason(d, job.model, job.weight_dtype, job.kv_dtype, tokens, job.slo.attainment)
        if why:
            pruned.append({"key": d.key, **d.to_dict(), "reason": why})
        else:
            kept.append(d)
    if not kept:
        raise KvlabError(f"no design fits in memory: {pruned[0]['key']}: {pruned[0]['reason']}")

    fingerprint = job_fingerprint(job, workload, traces)
    stored = resume.load(resume_path, fingerprint) if resume_path else {}
    results = {d.key: stored[d.key] for d in kept if d.key in stored}
    todo = [d for d in kept if d.key not in results]
    writer = resume.Writer(resume_path, fingerprint) if resume_path else None
    metric = rank.metric_of(prices)
    by_key = {d.key: d for d in kept}

    def best_row():
        rows = [rank.entry(by_key[k], r, prices) for k, r in results.items()]
        return rank.ranked(rows, metric)[0] if rows else None

    def on_result(design, result):
        result = resume.normalized(result)
        results[design.key] = result
        if writer:
            writer.append(design.key, result)
        if progress:
            progress(len(results), len(kept), best_row())

    if progress and results:
        progress(len(results), len(kept), best_row())
    try:
        if runner == "serial" or not todo:
            runners.run_serial(todo, job, traces, on_result)
        elif runner == "local":
            runners.run_pool(todo, job, traces, on_result, workers)
        else:
            runners.run_ray(todo, job, traces, on_result, ray_address)
    finally:
        if writer:
            writer.close()

    rows = rank.ranked([rank.entry(d, results[d.key], prices) for d in kept], metric)
    front = rank.pareto(rows, metric)
    return jsonable(
        {
            "model": job.model,
            "workload": {**workload.to_dict(), "trace_name": traces[0].name.split(" [")[0]},
            "slo": {
                "ttft_s": job.slo.ttft_s,
                "tbt_s": job.slo.tbt_s,
                "tbt_stat": job.slo.tbt_stat,
                "attainment": job.slo.attainment,
            },
            "job": fingerprint,
            "gpus_offered": dict(offers),
            "prices_usd_per_gpu_hour": prices,
            "space": space.to_dict(),
            "ranked_by": metric,
            "designs": rows,
            "best": rows[0],
            "pareto": front,
            "why": rank.why(rows, metric),
            "pruned": pruned,
            "evaluated": len(todo),
            "reused": len(kept) - len(todo),
            "runner": runner,
            "wall_s": time.perf_counter() - started,
        }
    )


def load_plan(path) -> dict:
    """A plan saved from `kvlab plan --json` (for a chapter that reads precomputed
    searches); raises KvlabError when the file is not one."""
    path = Path(path)
    try:
        out = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KvlabError(f"{path}: not a kvlab plan JSON file ({exc})") from None
    if not isinstance(out, dict) or not {"designs", "best", "pareto"} <= set(out):
        raise KvlabError(f"{path}: not a kvlab plan JSON file (no designs, best, pareto)")
    return out
