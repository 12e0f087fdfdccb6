"""The Voila dashboard, live: it starts offline, a dragged slider re-runs the ledger, and
the numbers shown are kvlab's for the new value."""
import re

import pytest

from browser import CHROMIUM_ARGS, SHOTS, chromium_path

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    from kvlab.viz.serve import start

    proc, url = start(home=str(tmp_path_factory.mktemp("home")))
    yield url
    proc.terminate()
    proc.wait(timeout=20)


def readout_values(page) -> dict[str, float]:
    html = page.inner_html(".kvlab-readout")
    return dict(re.findall(r'data-key="(\w+)" data-value="([^"]*)"', html))


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
            "(old) => { const el = document.querySelector('.kvlab-readout td[data-key=\"tokens_per_s\"]');"
            " return el && el.dataset.value !== old; }", arg=before["tokens_per_s"], timeout=20_000)
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
