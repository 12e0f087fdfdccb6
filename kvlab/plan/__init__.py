"""Plan a deployment: which cluster design serves a workload at its SLOs with the most
requests per GPU (or per dollar), found by simulating each design at its saturation rate.

    plan(job, workload, offers, space, prices, runner, ...) -> dict   (kvlab/plan/search.py)
    Job, Slo          the model, dtypes, speed, SLOs and attainment target (evaluate.py)
    Workload          a trace cut into slices of consecutive requests (workload.py)
    Space, Design     the axes and one point of them; parse_gpus, parse_prices (space.py)
    saturation_of     one design's capacity: the simulator's saturation search (evaluate.py)
    prune_reason      why a design cannot fit in memory, before simulating (prune.py)
    load_plan         read back a saved `kvlab plan --json` result
    slo_front         the search at several SLO targets: capacity per target, best per
                      target (front.py)

The runners (runners.py) evaluate designs in this process, on a process pool over every
core, or as Ray tasks; the resume file (resume.py) keeps each finished evaluation.
"""

from .evaluate import Job, Slo, saturation_of
from .front import slo_front
from .prune import prune_reason
from .search import RUNNERS, load_plan, plan
from .space import Design, Space, enumerate_designs, parse_gpus, parse_prices
from .workload import Workload

__all__ = [
    "Design",
    "Job",
    "RUNNERS",
    "Slo",
    "Space",
    "Workload",
    "enumerate_designs",
    "load_plan",
    "parse_gpus",
    "parse_prices",
    "plan",
    "prune_reason",
    "saturation_of",
    "slo_front",
]
