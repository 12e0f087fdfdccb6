"""Shared test set-up: a throw-away $HOME (kernels and browsers write there) and paths."""
from __future__ import annotations

import os
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


def pytest_configure(config):
    """Chapter notebooks run under nbval's lax mode where nbval is installed (every cell runs,
    only cells marked NBVAL_CHECK_OUTPUT are compared). Not in pyproject's addopts, so that
    `pytest -m gpu` starts on a GPU box that has pytest but not nbval. Without
    pytest-timeout, its marker is declared so --strict-markers accepts the tests that use it."""
    plugins = config.pluginmanager
    if plugins.hasplugin("nbval") and not (config.option.nbval or config.option.nbval_lax):
        config.option.nbval_lax = True
    if not plugins.hasplugin("timeout"):
        config.addinivalue_line("markers",
                                "timeout(seconds): a time limit (pytest-timeout; unenforced here)")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
