"""Capacity against the SLO targets: the same search at several (TTFT, TBT) limits, each
design's capacity at each, and the best design per target. The front is the best
capacity per GPU (or per dollar) as a function of the target: how much a stricter SLO
costs, and where the winning design changes (a chapter precomputes this once).
"""

from __future__ import annotations

import dataclasses

from ..errors import KvlabError
from .evaluate import Job, Slo
from .search import plan


def slo_front(job: Job, workload, offers, slos, space=None, **plan_kwargs) -> dict:
    """`plan` at each Slo of `slos`: {"points": [{ttft_s, tbt_s, tbt_stat, attainment,
    best, best_capacity, capacity: {design key: metric}}], "ranked_by", "designs": keys}.
    Points keep the order of `slos`; a target no design meets has best None."""
    slos = list(slos)
    if not slos or not all(isinstance(s, Slo) for s in slos):
        raise KvlabError("slo_front needs one or more Slo targets")
    points, keys, metric = [], [], None
    for slo in slos:
        out = plan(dataclasses.replace(job, slo=slo), workload, offers, space, **plan_kwargs)
        metric = out["ranked_by"]
        capacity = {r["key"]: r[metric] for r in out["designs"]}
        keys = keys or sorted(capacity)
        best = out["best"] if out["best"]["saturation_requests_per_s"] > 0 else None
        points.append(
            {
                "ttft_s": slo.ttft_s,
                "tbt_s": slo.tbt_s,
                "tbt_stat": slo.tbt_stat,
                "attainment": slo.attainment,
                "best": best["key"] if best else None,
                "best_capacity": best[metric] if best else 0.0,
                "capacity": capacity,
            }
        )
    return {"ranked_by": metric, "designs": keys, "points": points}
