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
    """Without pytest-timeout (a GPU box has pytest only), its marker is declared so that
    --strict-markers accepts the tests that use it. (notebooks/conftest.py sets nbval up.)"""
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line(
            "markers", "timeout(seconds): a time limit (pytest-timeout; unenforced here)"
        )


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
