"""The Voila dashboard, live: it starts offline, a dragged slider re-runs the ledger, and
the numbers shown are kvlab's for the new value; so do the levers the static book teaches
(measured kernels, tensor parallelism, speculative decoding) and the serving run with its
latency percentiles; every label is whole at 1280 px and on a 390 px phone; the server
checks its port and takes everything it started down when it is stopped."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from browser import CHROMIUM_ARGS, TEXT_FIT, WIDTHS, chromium_path, screenshot

from kvlab.viz.serve import die_with_parent, free_port, start, stop

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "notebooks" / "dashboard.ipynb"


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    proc, url = start(DASHBOARD, home=str(tmp_path_factory.mktemp("home")))
    yield url
    stop(proc)


def readout_values(page, where: str = ".kvlab-readout") -> dict[str, str]:
    html = page.inner_html(where)
    return dict(re.findall(r'data-key="(\w+)" data-value="([^"]*)"', html))


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_dashboard(browser, url: str, width: int = WIDTHS["desktop"], height: int = 1000):
    """The dashboard, loaded (its kernel computed the readout, drew the figures and ran the
    serving simulation once), and the list its errors will be collected into."""
    page = browser.new_page(viewport={"width": width, "height": height})
    problems = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
    page.goto(url)
    page.wait_for_selector(".kvlab-readout", timeout=90_000)
    page.wait_for_selector(".bk-Canvas, .bk-canvas, canvas", timeout=30_000)
    page.wait_for_selector(".kvlab-serving-readout .kvlab-readout", timeout=60_000)
    return page, problems


def wait_for_change(page, key: str, old: str, where: str = ".kvlab-readout") -> None:
    page.wait_for_function(
        "([where, key, old]) => { const el = document.querySelector("
        '`${where} td[data-key="${key}"]`); return el && el.dataset.value !== old; }',
        arg=[where, key, old],
        timeout=30_000,
    )


def type_into_readout(page, control: str, text: str) -> None:
    """Set a live slider by typing into its readout, as a reader can."""
    readout = page.locator(f".kvlab-control-{control} .widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def step_slider(page, control: str, presses: int) -> None:
    """Move a live slider `presses` grid steps right with the keyboard."""
    page.locator(f".kvlab-control-{control} .noUi-handle").focus()
    for _ in range(presses):
        page.keyboard.press("ArrowRight")


@pytest.mark.browser
def test_dragging_a_live_slider_reruns_the_ledger(dashboard, browser):
    from kvlab.viz.dashboard import dashboard_panel  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    page, problems = open_dashboard(browser, dashboard, 1300)
    before = readout_values(page)
    batch = page.locator(".kvlab-control-batch .widget-slider")
    handle = batch.locator(".noUi-handle")
    box = handle.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + 80, box["y"] + box["height"] / 2, steps=6)
    page.mouse.up()
    wait_for_change(page, "tokens_per_s", before["tokens_per_s"])
    page.wait_for_timeout(500)
    after = readout_values(page)
    shown_batch = int(batch.locator(".widget-readout").inner_text().replace(",", ""))
    page.close()
    assert problems == []
    panel = dashboard_panel()
    expected = panel.values(batch=shown_batch)
    assert float(after["tokens_per_s"]) == pytest.approx(expected["tokens_per_s"], rel=1e-9)
    assert float(after["step_time_s"]) == pytest.approx(expected["step_time_s"], rel=1e-9)
    assert after["tokens_per_s"] != before["tokens_per_s"]


@pytest.mark.browser
def test_the_books_levers_rerun_the_ledger_and_the_serving_run(dashboard, browser):
    """Measured kernels, tensor parallelism, the draft length and its acceptance, then a
    serving run on another cluster design: each shows kvlab's numbers for what the page's
    widgets show."""
    from kvlab.viz.dashboard import SERVING_RATES, _serving_run, dashboard_panel  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    page, problems = open_dashboard(browser, dashboard)
    first = readout_values(page)
    page.select_option(".kvlab-control-speed select", label="measured kernels")
    wait_for_change(page, "speed", first["speed"])
    step_slider(page, "tensor_parallel", 1)  # 1 -> 2 GPUs
    wait_for_change(page, "allreduce_share", first["allreduce_share"])
    before = readout_values(page)
    type_into_readout(page, "draft_tokens", "6")
    wait_for_change(page, "spec_tokens_per_verify", before["spec_tokens_per_verify"])
    before = readout_values(page)
    type_into_readout(page, "acceptance", "0.85")
    wait_for_change(page, "spec_tokens_per_verify", before["spec_tokens_per_verify"])
    page.wait_for_timeout(500)
    shown = readout_values(page)

    def readout_of(control: str) -> str:
        return page.locator(f".kvlab-control-{control} .widget-readout").inner_text()

    state = {
        "speed": "measured",
        "tensor_parallel": int(readout_of("tensor_parallel")),
        "draft_tokens": int(readout_of("draft_tokens")),
        "acceptance": float(readout_of("acceptance")),
    }
    serving = readout_values(page, ".kvlab-serving-readout")
    page.select_option(".kvlab-control-arch select", label="colocated")
    step_slider(page, "rate", 1)
    page.click(".kvlab-serving-run")
    page.wait_for_function(
        "() => (document.querySelector('.kvlab-serving-status') || {}).textContent"
        "?.includes('colocated')",
        timeout=60_000,
    )
    wait_for_change(page, "ttft_p50_s", serving["ttft_p50_s"], ".kvlab-serving-readout")
    ran = readout_values(page, ".kvlab-serving-readout")
    run = {
        "arch": "colocated",
        "rate": SERVING_RATES[SERVING_RATES.index(4) + 1],
        "prefill": int(readout_of("prefill")),
        "decode": int(readout_of("decode")),
    }
    rate_shown = readout_of("rate")
    page.close()
    assert problems == []
    assert state == {
        "speed": "measured",
        "tensor_parallel": 2,
        "draft_tokens": 6,
        "acceptance": 0.85,
    }
    panel = dashboard_panel()
    want = panel.values(**state)
    assert shown["speed"] == want["speed"] and shown["speed"].startswith("measured: ")
    for key in (
        "step_time_s",
        "tokens_per_s",
        "allreduce_share",
        "spec_tokens_per_verify",
        "spec_each",
        "spec_speedup",
    ):
        assert float(shown[key]) == pytest.approx(want[key], rel=1e-9), key
    # (1 - A^(K+1)) / (1 - A): Leviathan et al.'s expected tokens per verify pass, by hand
    assert float(shown["spec_tokens_per_verify"]) == pytest.approx((1 - 0.85**7) / 0.15)
    assert 0 < float(shown["allreduce_share"]) < 1  # two GPUs: all-reduces take part of a step
    assert rate_shown == str(run["rate"])
    summary = _serving_run({**panel.default_state, **state}, run)
    for key in ("requests_completed", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s"):
        assert float(ran[key]) == pytest.approx(summary[key], rel=1e-9), key
    assert float(ran["ttft_p50_s"]) <= float(ran["ttft_p90_s"]) <= float(ran["ttft_p99_s"])
    assert float(ran["itl_p50_s"]) <= float(ran["itl_p90_s"]) <= float(ran["itl_p99_s"])


@pytest.mark.browser
@pytest.mark.parametrize("width", list(WIDTHS.values()), ids=list(WIDTHS))
def test_every_label_and_value_is_whole(dashboard, browser, width):
    """No control label ("Achieved fraction of peak", "Prefix-cache hit (share of
    prompt)"), readout or serving-run text is cut or runs off the page (tests/text_fit.js)."""
    page, problems = open_dashboard(browser, dashboard, width, height=3200)
    page.wait_for_timeout(1000)
    cut = page.evaluate(TEXT_FIT, ["body", "body"])
    labels = page.locator(".kvlab-label").all_inner_texts()
    screenshot(page, f"dashboard-{width}")
    page.close()
    assert not cut, "\n".join(cut[:12])
    assert problems == []
    assert {"Achieved fraction of peak", "Prefix-cache hit (share of prompt)"} <= set(labels)


def _serve(*argv, env=None, cwd=ROOT):
    return subprocess.Popen(
        [sys.executable, "-m", "kvlab", "dashboard", *argv],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_sigterm_takes_voila_and_its_kernel_down(tmp_path):
    """Start the server (from a folder outside the checkout, the notebook named), open the
    page (Voila starts a kernel for it), SIGTERM the server: Voila and the kernel are gone
    and nothing listens on the port."""
    psutil = pytest.importorskip("psutil")
    port = free_port()
    server = _serve(str(DASHBOARD), "--port", str(port), env={"HOME": str(tmp_path)}, cwd=tmp_path)
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

    port = free_port()
    server = _serve("--port", str(port), "--json", env={"HOME": str(tmp_path)})
    try:
        where = json.loads(server.stdout.readline())  # --json: one line, once it serves
        assert where == {
            "url": f"http://127.0.0.1:{port}/",
            "port": port,
            "notebook": str(DASHBOARD),
        }
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


def test_outside_a_checkout_the_default_notebook_is_one_line(tmp_path):
    server = _serve("--port", "0", cwd=tmp_path)
    out, err = server.communicate(timeout=60)
    assert server.returncode == 2 and out == "" and err.count("\n") == 1
    assert f"'notebooks/dashboard.ipynb' does not exist under {tmp_path}" in err
    assert "run from the root of a kvlab checkout or name the notebook" in err


def test_a_taken_port_fails_instead_of_moving():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = _serve("--port", str(port))
        out, err = server.communicate(timeout=60)
    assert server.returncode == 2 and out == ""
    assert f"port {port} on 127.0.0.1 is not available" in err


# ------------------------------------------------------------------ the Python side
def test_dashboard_levers_hand_checked():
    """Llama 3.1 8B, fp16 KV, 4,096 tokens: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B
    = 131,072 B a token, 537 MB a request, 10.7 ms over one 400 Gb/s NIC (50 GB/s)."""
    from kvlab.viz.dashboard import dashboard_panel  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    panel = dashboard_panel()
    plain = panel.values()
    assert plain["transfer_s"] == pytest.approx(131_072 * 4096 / 50e9, rel=1e-12)
    assert plain["allreduce_share"] == 0.0  # one GPU: nothing to all-reduce
    assert plain["speed"] == "ceiling × 100%"
    k, a = 4, 0.7
    assert plain["spec_tokens_per_verify"] == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    split = panel.values(tensor_parallel=2)
    assert 0 < split["allreduce_share"] < 1
    assert split["weight_read_bytes"] == pytest.approx(plain["weight_read_bytes"] / 2, rel=0.02)
    assert split["transfer_s"] == plain["transfer_s"]  # a request's KV is the same KV
    measured = panel.values(speed="measured")
    assert measured["speed"].startswith("measured: ")
    assert measured["step_time_s"] > plain["step_time_s"]  # real kernels, below the ceiling
    outside = panel.values(speed="measured", batch=4096, context=262144)
    assert outside["speed"] == "ceiling × 100%: outside the tables' range"


def test_serving_run_is_small_and_orders_its_percentiles():
    from kvlab.viz.dashboard import SERVING_REQUESTS, _serving_run, dashboard_panel  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    state = dashboard_panel().default_state
    run = {"arch": "disaggregated", "rate": 4, "prefill": 1, "decode": 2}
    summary = _serving_run(state, run)
    assert summary["requests"] == SERVING_REQUESTS and summary["requests_completed"] > 0
    for kind in ("ttft", "itl"):
        assert summary[f"{kind}_p50_s"] <= summary[f"{kind}_p90_s"] <= summary[f"{kind}_p99_s"]
    assert "3 GPUs" in summary["note"] and "(generated)" in summary["note"]
    assert summary == _serving_run(state, run)  # seeded: the same run, the same numbers
