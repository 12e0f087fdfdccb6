"""Shared test set-up: a throw-away $HOME (kernels and browsers write there), paths, and the
order in which pytest-xdist's workers take the tests (slowest first, so they finish together)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

if not os.environ.get("KVLAB_KEEP_HOME"):
    _home = tempfile.mkdtemp(prefix="kvlab-test-home-")
    os.environ["HOME"] = _home
    os.environ.setdefault("IPYTHONDIR", os.path.join(_home, ".ipython"))
    os.environ.setdefault("JUPYTER_CONFIG_DIR", os.path.join(_home, ".jupyter"))
    os.environ.setdefault("JUPYTER_DATA_DIR", os.path.join(_home, ".local", "share", "jupyter"))
    # kvlab's native kernels and this machine's timed kernel choice (kvlab.decoder.tune):
    # built and timed once per run, not once per pytest-xdist worker (each has its own
    # $HOME; a worker inherits this from the process that started it, which set it first)
    os.environ.setdefault("KVLAB_NATIVE_DIR", os.path.join(_home, ".cache", "kvlab", "native"))

# Three pytest-xdist workers share two cores, and torch's and kvlab's kernels run two OpenMP
# threads each: at a barrier, a thread whose partner is descheduled spins for its share of
# the core unless told to sleep. Passive waiting changes no result (the same threads run
# the same code) and cut the timing tests' CPU by a quarter (149 -> 114 CPU s for
# test_bench, test_bench_quick and test_kv_transfer run side by side). Set before torch
# loads; workers, kernels and CLI subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config):
    """Without pytest-timeout (a GPU box has pytest only), its marker is declared so that
    --strict-markers accepts the tests that use it. (notebooks/conftest.py sets nbval up.)"""
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line(
            "markers", "timeout(seconds): a time limit (pytest-timeout; unenforced here)"
        )


#: Seconds a unit of work took in `pytest --durations=0` on the shared 2-core machine
#: (2026-12-01, under load: only the order matters). A file is one unit (its module
#: fixtures are built once); in SPLIT_FILES each test is one (see below). Unlisted: 0.
#: test_labs, test_plan, test_fuzz and 05b: those figures scaled by the after/before ratio
#: of their own runs, one file at a time, when their shared set-up came in (2026-12-02).
SLOW_UNITS = {
    "test_labs.py": 130,
    "test_bench_quick.py": 216,  # one `kvlab bench all --quick`, checked per benchmark
    "test_js.py": 167,
    "test_viz.py": 149,
    "test_plan.py": 108,
    "test_decoder.py": 131,
    "test_dashboard.py": 114,
    "test_native.py": 103,
    "test_fuzz.py": 54,
    "test_book.py": 71,
    "test_cli.py": 60,
    "test_bench.py::test_gpu_session_dry_run_on_the_cpu": 54,
    "05b_prefix_caching.ipynb": 21,
    "test_bench.py::test_decode_compares_kernels_point_by_point": 50,
    "test_saturation.py": 46,
    "test_traces.py": 31,
    "test_i18n_chapters.py": 30,
    "test_sim.py": 28,
    "test_kv_transfer.py::test_same_code_runs_under_torchrun": 27,
    "test_i18n.py": 23,
    "test_bench.py::test_decode_time_budget_skips_points": 22,
    "test_bench.py::test_a_result_that_cannot_be_saved_is_printed_first": 21,
    "06_plan_a_deployment.ipynb": 21,
    "02_bandwidth_wall.ipynb": 20,
    "04_kv_centric.ipynb": 17,
    "02c_past_the_ceiling.ipynb": 17,
    "03_beyond_hbm.ipynb": 17,
    "02b_measured.ipynb": 16,
    "test_prefix.py": 16,
    "test_kv_transfer.py::test_ctrl_c_stops_both_processes": 15,
    "test_kv_transfer.py::test_a_hung_peer_times_out": 14,
    "05_metrics_and_diagnosis.ipynb": 14,
    "test_kv_transfer.py::test_a_dying_peer_is_a_clear_error": 13,
    "test_kv_transfer.py::test_quick_transfer_moves_the_kv_intact": 13,
    "test_plan_chapter.py": 12,
    "test_kv_transfer.py::test_mooncake_doorbell_completion": 12,
    "test_bench.py::test_decode_refuses_points_one_by_one_and_goes_on": 12,
    "01_what_a_hit_saves.ipynb": 11,
    "test_bench.py::test_gpu_session_stays_inside_its_deadline": 10,
    "dashboard.ipynb": 8,
    "test_browser.py::test_dragging_a_slider_with_the_mouse_updates_the_readout": 6,
    "test_architecture.py": 6,
    # test_browser.py, one unit a page (its tests share its tabs): ranked by the page's checks,
    # the bandwidth wall's panels the heaviest (2026-12-02); only the order matters
    **{
        f"test_browser.py::{edition}notebooks/{page}.html": weight
        for edition in ("", "zh/")
        for page, weight in (
            ("02_bandwidth_wall", 40),
            ("03_beyond_hbm", 35),
            ("04_kv_centric", 30),
            ("05b_prefix_caching", 30),
            ("02c_past_the_ceiling", 25),
            ("05_metrics_and_diagnosis", 25),
            ("01_what_a_hit_saves", 15),
            ("06_plan_a_deployment", 15),
            ("02b_measured", 8),
        )
    },
}
#: Files whose tests share nothing expensive (module fixtures: a browser, a local HTTP
#: server): under `--dist loadfile` their tests spread over the workers one by one (but
#: test_browser.py's tests of one page stay together, see `_page_unit`).
SPLIT_FILES = {"test_browser.py", "test_bench.py", "test_kv_transfer.py"}


#: test_browser.py's tests of one page share its tabs: they run together, one unit a page.
PAGE = re.compile(r"\[([^\]#]+?\.html)")


def _page_unit(nodeid: str) -> str | None:
    path, _, rest = nodeid.partition("::")
    found = PAGE.search(rest) if path.endswith("test_browser.py") else None
    return f"test_browser.py::{found.group(1)}" if found else None


def _unit(item) -> str:
    name = item.path.name
    page = _page_unit(item.nodeid)
    if page:
        return page
    if name in SPLIT_FILES:
        return f"{name}::{getattr(item, 'originalname', None) or item.name}"
    return name


def pytest_collection_modifyitems(config, items):
    """On an xdist worker, the slowest units first (a stable sort: within a unit the order
    stays pytest's), so that the workers finish together. A plain `pytest` keeps its order."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: -SLOW_UNITS.get(_unit(item), 0))


@pytest.hookimpl(optionalhook=True)  # pytest alone (a GPU box) has no xdist
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` as xdist does it (a file's tests on one worker, which builds its
    module fixtures once; a notebook's cells in one kernel), but each test of SPLIT_FILES a
    unit of its own, and the units handed out in the workers' (slowest-first) order rather
    than by their number of tests. Every test still runs; only the order and the worker
    change. (`--dist loadgroup` does not group under pytest 9 with xdist 3.8.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # noqa: PLC0415 - only under xdist

    class SlowestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            page = _page_unit(nodeid)
            if page:
                return page
            return nodeid if path.rsplit("/", 1)[-1] in SPLIT_FILES else path

    config.option.loadscopereorder = False
    return SlowestFirst(config, log)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
