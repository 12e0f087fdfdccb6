"""The Voila dashboard, live: it starts offline, a dragged slider re-runs the ledger, and
the numbers shown are kvlab's for the new value; the server checks its port and takes
everything it started down when it is stopped."""

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from browser import CHROMIUM_ARGS, SHOTS, chromium_path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    from kvlab.viz.serve import start, stop

    proc, url = start(home=str(tmp_path_factory.mktemp("home")))
    yield url
    stop(proc)


def readout_values(page) -> dict[str, float]:
    html = page.inner_html(".kvlab-readout")
    return dict(re.findall(r'data-key="(\w+)" data-value="([^"]*)"', html))


@pytest.mark.browser
def test_dragging_a_live_slider_reruns_the_ledger(dashboard):
    from playwright.sync_api import sync_playwright

    from kvlab.viz.dashboard import dashboard_panel

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        problems = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
        page.goto(dashboard)
        page.wait_for_selector(".kvlab-readout", timeout=90_000)
        page.wait_for_selector(".bk-Canvas, .bk-canvas, canvas", timeout=30_000)
        before = readout_values(page)
        batch = page.locator(".widget-slider").first
        handle = batch.locator(".noUi-handle")
        box = handle.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(box["x"] + 80, box["y"] + box["height"] / 2, steps=6)
        page.mouse.up()
        page.wait_for_function(
            "(old) => { const el = "
            "document.querySelector('.kvlab-readout td[data-key=\"tokens_per_s\"]');"
            " return el && el.dataset.value !== old; }",
            arg=before["tokens_per_s"],
            timeout=20_000,
        )
        page.wait_for_timeout(500)
        after = readout_values(page)
        shown_batch = int(batch.locator(".widget-readout").inner_text().replace(",", ""))
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "dashboard.png"), full_page=True)
        browser.close()
    assert problems == []
    panel = dashboard_panel()
    expected = panel.values(batch=shown_batch)
    assert float(after["tokens_per_s"]) == pytest.approx(expected["tokens_per_s"], rel=1e-9)
    assert float(after["step_time_s"]) == pytest.approx(expected["step_time_s"], rel=1e-9)
    assert after["tokens_per_s"] != before["tokens_per_s"]


def _serve(*argv, env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "kvlab.viz.serve", *argv],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_sigterm_takes_voila_and_its_kernel_down(tmp_path):
    """Start the server, open the page (Voila starts a kernel for it), SIGTERM the server:
    Voila and the kernel are gone and nothing listens on the port."""
    psutil = pytest.importorskip("psutil")
    from kvlab.viz.serve import free_port

    port = free_port()
    server = _serve("--port", str(port), env={"HOME": str(tmp_path)})
    try:
        line = server.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line  # the port it really listens on
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=120).status == 200
        started = psutil.Process(server.pid).children(recursive=True)
        assert any("voila" in " ".join(p.cmdline()) for p in started)
        assert any("ipykernel" in " ".join(p.cmdline()) for p in started)  # the page's kernel
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
    _, alive = psutil.wait_procs(started, timeout=10)
    assert alive == []
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_kill_9_of_the_server_takes_voila_and_its_kernel_down(tmp_path):
    """`kill -9` runs no handler of the server's: Voila gets SIGTERM from Linux when its parent
    dies (PR_SET_PDEATHSIG), shuts its kernel down and frees the port."""
    psutil = pytest.importorskip("psutil")
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    from kvlab.viz.serve import free_port

    port = free_port()
    server = _serve("--port", str(port), env={"HOME": str(tmp_path)})
    try:
        line = server.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=120).status == 200
        started = psutil.Process(server.pid).children(recursive=True)
        assert any("voila" in " ".join(p.cmdline()) for p in started)
        assert any("ipykernel" in " ".join(p.cmdline()) for p in started)
        server.send_signal(signal.SIGKILL)
        assert server.wait(timeout=60) == -signal.SIGKILL
    finally:
        if server.poll() is None:
            server.kill()
    _, alive = psutil.wait_procs(started, timeout=30)
    leftovers = [" ".join(p.cmdline())[:80] for p in alive]
    for p in alive:  # do not leave them to the next test, whatever happens
        p.kill()
    assert leftovers == []
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_the_parent_death_signal_is_armed_in_the_child():
    """What the test above relies on, in a second: a child started with `die_with_parent`
    carries SIGTERM as its parent-death signal (Linux: /proc/<pid>/status has no field for
    it, so the child asks prctl itself)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    from kvlab.viz.serve import die_with_parent

    code = (
        "import ctypes, signal; libc = ctypes.CDLL(None); v = ctypes.c_int(); "
        "libc.prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value == signal.SIGTERM)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=die_with_parent(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "True", done.stderr


@pytest.mark.parametrize(
    "argv,env,fragment",
    [
        (["--port", "70000"], {}, "--port: expected a port from 1 to 65535"),
        (["--port", "http"], {}, "--port: expected a port"),
        ([], {"PORT": "abc"}, "PORT: expected a port from 1 to 65535"),
        (["missing.ipynb", "--port", "0"], {}, "missing.ipynb' does not exist"),
    ],
)
def test_bad_ports_and_notebooks_are_one_line(argv, env, fragment):
    server = _serve(*argv, env=env)
    out, err = server.communicate(timeout=60)
    assert server.returncode == 2 and out == ""
    assert fragment in err and err.count("\n") == 1


def test_a_taken_port_fails_instead_of_moving():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = _serve("--port", str(port))
        out, err = server.communicate(timeout=60)
    assert server.returncode == 2 and out == ""
    assert f"port {port} on 127.0.0.1 is not available" in err
