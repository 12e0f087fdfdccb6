"""The built book in a real browser, as a smoke test, in both editions (English at the
root, Chinese under zh/): every page clean and offline, every static panel's readout equal
to what kvlab computes (`kvlab budget --json` for ledger quantities) as built and after a
few control changes (in Chinese: the same values, their words through kvlab.viz.i18n), a
slider dragged with the mouse, the Chinese search. Every panel and figure can be read at
the widths readers use (1280 px and a 390 px phone): no text cut by an ancestor that hides
overflow or running past the text column, no legend over the data, as built and after
every control moves (tests/text_fit.js). The panels' JavaScript over their whole grids,
and the formatting twins digit for digit, are checked under node by tests/test_js.py."""

from __future__ import annotations

import contextlib
import functools
import html as html_lib
import io
import json
import math
import re
from contextlib import redirect_stdout

import pytest
from browser import (
    CHROMIUM_ARGS,
    ROOT,
    TOO_WIDE,
    WIDTHS,
    ZH,
    bokeh_pages,
    chromium_path,
    edition,
    ensure_site,
    page_language,
    page_panels,
    screenshot,
    serve,
    site_pages,
    unreadable,
)

from kvlab.book.catalog import panels
from kvlab.cli import main
from kvlab.viz import i18n
from kvlab.viz.panel import FORMATS

pytestmark = pytest.mark.browser

CLI_FLAGS = {
    "model": "--model",
    "hardware": "--hardware",
    "batch": "--batch",
    "context": "--context",
    "weight_dtype": "--weight-dtype",
    "kv_dtype": "--kv-dtype",
    "efficiency": "--efficiency",
    "cached": "--cached",
    "bandwidth": "--bandwidth",
}


def pytest_generate_tests(metafunc):
    """`page` is module-scoped, so that pytest runs a page's tests one after another and
    they share its tabs (SiteTab); `panel` is (page, panel key)."""
    names = metafunc.fixturenames
    if "page" not in names:
        return
    ensure_site()
    if "panel" in names:
        found = page_panels()
        ids = [f"{page}#{key}" for page, key in found]
        pairs = [(page, (page, key)) for page, key in found]
        metafunc.parametrize(("page", "panel"), pairs, ids=ids, scope="module")
    else:
        pages = getattr(metafunc.function, "pages", site_pages)()
        metafunc.parametrize("page", pages, scope="module")
    if "width" in names:
        metafunc.parametrize("width", list(WIDTHS.values()), ids=list(WIDTHS))


@pytest.fixture(scope="session")
def base_url():
    with serve(ensure_site()) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def site(browser, base_url):
    """The open pages of the site, one tab per (page, width), shared by the tests that read
    them (SiteTab)."""
    pool = TabPool(browser, base_url)
    yield pool
    pool.close()


#: The problems list each open tab's listeners append to (open_page swaps it per load).
SINKS: dict = {}


def open_page(browser, url, width: int = WIDTHS["desktop"], tab=None):
    """Open a page and record everything that went wrong while it loaded. A `tab` given
    (one a finished page left) is navigated instead of a new one opened: a new tab starts a
    renderer process, ~1.5 s of CPU a page here. It goes through about:blank first, so
    nothing of the page it showed lands in this page's problems, and it loads at `width`."""
    if tab is None:
        tab = browser.new_page(viewport={"width": width, "height": 900})
        _listen(tab, url)
    else:
        tab.goto("about:blank")
        tab.set_viewport_size({"width": width, "height": 900})
    problems = SINKS[tab] = []
    tab.goto(url)
    tab.wait_for_load_state("networkidle")
    if tab.url != url:  # a redirect page (index.html): requests it started were cancelled
        tab.wait_for_load_state("networkidle")
        problems[:] = [p for p in problems if "net::ERR_ABORTED" not in p]
    return tab, problems


def _listen(tab, url: str) -> None:
    """Record the tab's errors, failed requests and requests that leave the site, into
    SINKS[tab] (the current page's list)."""
    site = url.split("/", 3)[0] + "//" + url.split("/")[2]

    def note(problem: str) -> None:
        SINKS[tab].append(problem)

    # the location names what failed (a favicon fetch fires no response event)
    tab.on(
        "console",
        lambda m: (
            note(f"console {m.type}: {m.text} ({m.location.get('url')})")
            if m.type == "error"
            else None
        ),
    )
    tab.on("pageerror", lambda e: note(f"page error: {e}"))
    tab.on("requestfailed", lambda r: note(f"failed request: {r.url} ({r.failure})"))

    def on_response(response):
        if response.url == "about:blank":
            return
        if not response.url.startswith(site):
            note(f"request left the site: {response.url}")
        elif response.status >= 400:
            note(f"HTTP {response.status}: {response.url}")

    tab.on("response", on_response)
    SINKS[tab] = []


class SiteTab:
    """One page of the site open at one width, shared by every test that reads that page at
    that width: a load costs Chromium 1-3 s of CPU, and the tests used to load a page up to
    eight times. What the page shows as built (its load's problems, the screenshot, each
    panel's state and readout, what cannot be read) is read when it opens, before any test
    moves a control, so no test depends on another; a test that moves controls puts them
    back (`moving`)."""

    def __init__(self, pool, page: str, width: int, tab=None):
        self.pool, self.page, self.width = pool, page, width
        url = f"{pool.base_url}/{page}"
        self.tab, self.problems = open_page(pool.browser, url, width, tab)
        try:
            self._read_as_built()
        except BaseException:
            self.tab.close()
            raise

    def _read_as_built(self) -> None:
        tab = self.tab
        self.panels = [key for p, key in page_panels() if p == self.page]
        if self.panels:
            tab.wait_for_function("window.Bokeh && Bokeh.documents.length > 0 && window.KVLAB")
        elif self.page in bokeh_pages():
            tab.wait_for_function("window.Bokeh && Bokeh.documents.length > 0")
        if self.width == WIDTHS["desktop"]:
            screenshot(tab, self.page.replace("/", "__"))
        self.built_too_wide = tab.evaluate(TOO_WIDE)
        self.built = {key: tab.evaluate(READ_PANEL, [key]) for key in self.panels}
        self.built_cut = {key: unreadable(tab, panel_scope(key)) for key in self.panels}
        if self.page in bokeh_pages():
            self.built_figures_cut = unreadable(tab, ".bd-article [data-root-id]")
        self.built_problems = list(self.problems)

    def problems_since(self, mark: int) -> list[str]:
        """What went wrong while the page loaded, and since `mark` (len(self.problems))."""
        return self.built_problems + self.problems[max(mark, len(self.built_problems)) :]

    @contextlib.contextmanager
    def moving(self, key: str):
        """Controls of panel `key` moved inside the block go back where they were after it
        (checked); a failure inside closes the tab instead (the next test loads the page)."""
        start = self.tab.evaluate(READ_PANEL, [key])
        try:
            yield
            now = self.tab.evaluate(READ_PANEL, [key])
            for control, meta in start["meta"].items():
                if now["state"][control] != start["state"][control]:
                    index = meta["options"].index(start["state"][control])
                    set_control(
                        self.tab, key, control, index if meta["kind"] == "slider" else str(index)
                    )
            self.tab.evaluate("window.scrollTo(0, 0)")
            self.tab.mouse.move(0, 0)
            assert self.tab.evaluate(READ_PANEL, [key])["state"] == start["state"]
        except BaseException:
            self.pool.discard(self)
            raise


class TabPool:
    """The open SiteTabs of a pytest process, the last KEEP used (a test file's tests of one
    page, at both widths, run one after another). A page the pool lets go leaves its tab
    to the next page opened (open_page)."""

    KEEP = 2

    def __init__(self, browser, base_url: str):
        self.browser, self.base_url = browser, base_url
        self.open: dict[tuple[str, int], SiteTab] = {}

    def get(self, page: str, width: int = WIDTHS["desktop"]) -> SiteTab:
        tab = self.open.pop((page, width), None)
        if tab is None:
            free = None
            if len(self.open) >= self.KEEP:  # the least recently used page gives up its tab
                free = self.open.pop(next(iter(self.open))).tab
            tab = SiteTab(self, page, width, free)
        self.open[(page, width)] = tab  # the most recent last
        return tab

    def discard(self, tab: SiteTab) -> None:
        """A tab in an unknown state (a test failed in it): closed, not reused."""
        if self.open.get((tab.page, tab.width)) is tab:
            del self.open[(tab.page, tab.width)]
        SINKS.pop(tab.tab, None)
        tab.tab.close()

    def close(self) -> None:
        for tab in list(self.open.values()):
            self.discard(tab)


def panel_scope(key: str) -> str:
    return f'.kvlab-panel[data-panel="{key}"]'


def set_control(tab, key: str, control: str, value) -> dict:
    """Move a panel's control to an option's index (a select takes it as a string, a slider
    as a number), wait for the panel's update; the panel as it is then (READ_PANEL)."""
    before = tab.evaluate(READ_PANEL, [key])["updates"]
    assert tab.evaluate(SET_CONTROL, [f"{key}.{control}", value])
    tab.wait_for_function(f"(window.KVLAB.updates || 0) > {before}", timeout=5000)
    return tab.evaluate(READ_PANEL, [key])


def test_toc_pages_were_built():
    expected = {"book/intro.html"} | {
        f"{m}.html" for m in re.findall(r"file:\s*(\S+)", (ROOT / "_toc.yml").read_text())
    }
    assert expected <= set(site_pages())
    assert {f"{ZH}/{page}" for page in expected} <= set(site_pages())  # the Chinese edition
    english = [key for page, key in page_panels() if page_language(page) == "en"]
    assert english, "the book embeds no static panel"
    assert sorted(key for page, key in page_panels() if page_language(page) != "en") == sorted(
        english
    )


def test_page_is_clean(site, page):
    assert site.get(page).problems_since(0) == []


# ------------------------------------------------------------------ panels
READ_PANEL = """([key]) => {
  const find = (n) => {
    for (const d of Bokeh.documents) { const m = d.get_model_by_name(n); if (m) return m; }
  };
  const root = document.querySelector(`.kvlab-panel[data-panel="${key}"]`);
  const meta = JSON.parse(root.dataset.controls);
  const state = {};
  for (const [k, c] of Object.entries(meta)) {
    // both kinds hold an index
    state[k] = c.options[Math.round(Number(find(`${key}.${k}`).value))];
  }
  return {meta, state, readout: find(`${key}.readout`).text, updates: window.KVLAB.updates || 0};
}"""

SET_CONTROL = """([name, value]) => {
  for (const d of Bokeh.documents) {
    const m = d.get_model_by_name(name);
    if (m) { m.value = value; return true; }
  }
  return false;
}"""


def parse_readout(html: str) -> dict[str, tuple[str, str]]:
    return {
        k: (raw, text)
        for k, raw, text in re.findall(
            r'<td data-key="([\w-]+)" data-value="([^"]*)"[^>]*>([^<]*)</td>', html
        )
    }


def budget_json(kwargs: dict) -> dict:
    argv = ["budget", "--json"]
    for key, value in kwargs.items():
        argv += [CLI_FLAGS[key], str(value)]
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


@functools.lru_cache(maxsize=None)
def built_panel(key: str, language: str = "en"):
    """Each panel once per session and edition (lookup panels replay traces when built)."""
    with edition(language):
        return panels()[key]()


def check_readout(panel_key: str, state: dict, readout_html: str, language: str = "en") -> None:
    """The page's readout equals kvlab: the CLI for ledger keys, the panel's Python twin else,
    computed as for the page's edition; the words in the edition's language."""
    with edition(language):
        _check_readout(built_panel(panel_key, language), state, readout_html)


def _check_readout(panel, state: dict, readout_html: str) -> None:
    expected = panel.compute(state)["values"]
    cli = budget_json(panel.budget_keys(state)) if panel.budget_keys else {}
    shown = parse_readout(readout_html)
    assert set(shown) == {k for k, _, _ in panel.readout}
    for key, _label, kind in panel.readout:
        raw, text = shown[key]
        want = cli[key] if key in cli else expected[key]
        if want is None or (isinstance(want, float) and not math.isfinite(want)):
            assert raw == "None", (key, raw, state)  # unbounded: the page cannot hold infinity
            want = None
        elif isinstance(want, str):
            assert raw == want, (key, state)
        elif isinstance(want, bool):
            assert raw == str(want).lower(), (key, state)
        else:
            assert math.isclose(float(raw), float(want), rel_tol=1e-9, abs_tol=1e-12), (
                key,
                raw,
                want,
                state,
            )
        assert html_lib.unescape(text) == i18n.t(FORMATS[kind](want)), (key, text, want, state)


def other_values(meta: dict, current) -> list:
    """Two option indices other than the current one (ends and middle of the list); selects
    take them as strings, sliders as numbers."""
    options = meta["options"]
    here = options.index(current)
    picks = [i for i in dict.fromkeys([0, len(options) - 1, len(options) // 2]) if i != here][:2]
    return picks if meta["kind"] == "slider" else [str(i) for i in picks]


def test_panel_readouts_match_kvlab(site, page, panel):
    page_path, key = panel
    language = page_language(page_path)
    page = site.get(page_path)
    mark = len(page.problems)
    first = page.built[key]
    check_readout(key, first["state"], first["readout"], language)  # as built, before any change
    with page.moving(key):
        for control, meta in first["meta"].items():
            for value in other_values(meta, first["state"][control]):
                now = set_control(page.tab, key, control, value)
                check_readout(key, now["state"], now["readout"], language)
    assert page.problems_since(mark) == []


def test_panel_text_fits_the_column(site, page, panel, width):
    """Every readout value and label, control title and option, tab title, legend entry
    and figure title of the panel can be read whole at this width, as built and after
    each control moves (two other values each, as the readout test moves them)."""
    key, page = panel[1], site.get(page, width)
    mark = len(page.problems)
    cut = [f"as built: {p}" for p in page.built_cut[key]]
    first = page.built[key]
    with page.moving(key):
        for control, meta in first["meta"].items():
            for value in other_values(meta, first["state"][control]):
                state = set_control(page.tab, key, control, value)["state"]
                cut += [f"{state}: {p}" for p in unreadable(page.tab, panel_scope(key))]
    assert not cut, "\n".join(cut[:12]) + f"\n({len(cut)} in all)"
    assert page.problems_since(mark) == []


def test_figures_fit_the_column(site, page, width):
    """Every figure of the page (panels as built included) can be read whole at this width."""
    page = site.get(page, width)
    cut = page.built_figures_cut
    assert not cut, "\n".join(cut[:12]) + f"\n({len(cut)} in all)"
    assert page.problems_since(0) == []


test_figures_fit_the_column.pages = bokeh_pages


def test_no_page_scrolls_sideways_on_a_phone(site, page):
    """At 390 px nothing on the page as built (a long inline command, a wide table) makes
    it wider than the screen, so that a reader scrolls it sideways; what is wide scrolls
    inside its own box (a code block, a table, a panel)."""
    wide = site.get(page, WIDTHS["phone"]).built_too_wide
    assert not wide, "\n".join(wide)


@pytest.mark.parametrize("language", ["en", "zh_CN"])
def test_dragging_a_slider_with_the_mouse_updates_the_readout(site, language):
    page_path, key = next(
        p for p in page_panels() if p[1] == "ledger" and page_language(p[0]) == language
    )
    page = site.get(page_path)
    mark = len(page.problems)
    tab = page.tab
    with page.moving(key):
        before = tab.evaluate(READ_PANEL, [key])
        handle = tab.locator(".bk-Slider .noUi-handle").first
        handle.scroll_into_view_if_needed()
        box = handle.bounding_box()
        tab.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        tab.mouse.down()
        tab.mouse.move(box["x"] + 120, box["y"] + box["height"] / 2, steps=8)
        tab.mouse.up()
        tab.wait_for_function(f"(window.KVLAB.updates || 0) > {before['updates']}", timeout=5000)
        after = tab.evaluate(READ_PANEL, [key])
        assert after["readout"] != before["readout"]
        check_readout(key, after["state"], after["readout"], language)
    assert page.problems_since(mark) == []


def test_chinese_readouts_are_in_chinese(site):
    """The static page's readout after a change keeps its Chinese labels (KVLAB.apply is
    wrapped by the table kvlab.viz.i18n ships with the Chinese site)."""
    page_path, key = next(
        p for p in page_panels() if p[1] == "ledger" and page_language(p[0]) == "zh_CN"
    )
    page = site.get(page_path)
    mark = len(page.problems)
    before = page.built[key]
    with page.moving(key):
        batch = other_values(before["meta"]["batch"], before["state"]["batch"])[0]
        after = set_control(page.tab, key, "batch", batch)["readout"]
    labels = re.findall(r"<th>([^<]*)</th>", after)
    assert labels and all(re.search(r"[\u4e00-\u9fff]", label) for label in labels), labels
    assert page.problems_since(mark) == []


def test_chinese_search_works_offline(browser, base_url):
    """Sphinx's search in the Chinese edition (words segmented by jieba at build time)."""
    tab, problems = open_page(browser, f"{base_url}/{ZH}/search.html?q=%E5%B8%A6%E5%AE%BD")  # 带宽
    tab.wait_for_function(
        "document.querySelectorAll('#search-results li').length > 0", timeout=15000
    )
    found = tab.evaluate("[...document.querySelectorAll('#search-results li a')].map(a => a.href)")
    SINKS.pop(tab, None)
    tab.close()
    assert any("glossary" in url for url in found), found
    assert problems == []
