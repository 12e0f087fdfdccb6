"""The chapter notebooks under pytest: nbval's lax mode where nbval is installed (every cell
runs, only cells marked NBVAL_CHECK_OUTPUT are compared), whether the whole suite runs or
one notebook (`pytest notebooks/02_bandwidth_wall.ipynb`). Not in pyproject's addopts, so
that `pytest -m gpu` starts on a GPU box that has pytest but not nbval."""


def pytest_configure(config):
    if config.pluginmanager.hasplugin("nbval") and not (
        config.option.nbval or config.option.nbval_lax
    ):
        config.option.nbval_lax = True
