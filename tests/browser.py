"""Shared browser-test plumbing: build or reuse the site (both editions: English at the
root, Chinese under zh/), serve it on 127.0.0.1, drive Debian's Chromium with Playwright
(no browser download)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The built site; KVLAB_SITE points the browser tests at another build (say, main's).
SITE = Path(os.environ.get("KVLAB_SITE") or ROOT / "_build" / "html")
#: Full-page screenshots of what the browser tests load, for a person to look at, taken
#: only when KVLAB_SCREENSHOTS is set (`KVLAB_SCREENSHOTS=1 make test`): no test reads
#: them, and they cost ~0.7 s of CPU a page.
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


#: The widths readers use: the book theme at 1280 px and a 390 px phone.
WIDTHS = {"desktop": 1280, "phone": 390}
#: tests/text_fit.js: what a reader cannot read (cut, or past the column) on a page.
TEXT_FIT = (Path(__file__).with_name("text_fit.js")).read_text(encoding="utf-8")
#: Every bokeh Tabs whose view lies inside `scope` (a CSS selector; shadow roots crossed), to
#: show each of its tabs in turn ([model id, tab count]).
TABS = """(scope) => {
  const parentOf = (el) => el.parentElement || (el.getRootNode() && el.getRootNode().host) || null;
  const inScope = (el) => {
    for (let a = el; a; a = parentOf(a)) if (a.matches && a.matches(scope)) return true;
    return false;
  };
  const out = [];
  for (const d of Bokeh.documents) {
    for (const m of d.all_models) {
      if (m.type !== "Tabs") continue;
      const view = Bokeh.index.find_one(m);
      if (view && view.el && inScope(view.el)) out.push([m.id, m.tabs.length]);
    }
  }
  return out;
}"""

#: Whether the page is wider than the screen (a reader would scroll the whole page
#: sideways): [] if not, else the width and the elements that reach past the screen's edge
#: (the innermost first).
TOO_WIDE = """() => {
  const width = document.documentElement.clientWidth;
  const whole = document.documentElement.scrollWidth;
  if (whole <= width + 1) return [];
  // inside a box that scrolls or clips across, or fixed to the screen (the theme's drawers):
  // neither widens the page
  const held = (el) => {
    if (getComputedStyle(el).position === "fixed") return true;
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX !== "visible" || s.position === "fixed") return true;
    }
    return false;
  };
  const out = [];
  for (const el of [...document.body.querySelectorAll("*")].reverse()) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > width + 1 && !held(el)) {
      const named = typeof el.className === "string" && el.className;
      const cls = named ? "." + el.className.split(" ")[0] : "";
      const text = JSON.stringify((el.textContent || "").trim().replace(/\\s+/g, " ").slice(0, 50));
      out.push(`${el.tagName.toLowerCase()}${cls} ${text} reaches ${Math.round(r.right)} px`);
    }
  }
  return [`the page is ${whole} px wide on a ${width} px screen`, ...out.slice(0, 8)];
}"""
#: Resolves after the next two frames: BokehJS renders a change in the frame after it (its
#: DOM text is set at once, its canvases are painted on an animation frame), so by then
#: what a reader would see is on the page. (Fixed sleeps of 100-150 ms found exactly the
#: same cuts, in checks where narrowed cells cut dozens of texts, at three times the wait.)
PAINTED = "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"
#: Show tab `index` of the Tabs model `id`; resolves once it is painted.
SHOW_TAB = (
    """async ([id, index]) => {
  for (const d of Bokeh.documents) {
    const m = d.get_model_by_id(id);
    if (m) m.active = index;
  }
  await ("""
    + PAINTED
    + """)();
}"""
)


def unreadable(tab, scope: str, column: str = "article.bd-article") -> list[str]:
    """tests/text_fit.js over `scope` (a CSS selector) on an open page, each tab of every
    bokeh Tabs inside `scope` shown in turn (a hidden tab's text is not checked while it is
    hidden)."""
    tab.evaluate(PAINTED)
    problems = tab.evaluate(TEXT_FIT, [scope, column])
    for model_id, count in tab.evaluate(TABS, scope):
        for index in [*range(1, count), 0]:  # back to the first tab, as the reader left it
            tab.evaluate(SHOW_TAB, [model_id, index])  # returns once the tab is painted
            if index:
                found = tab.evaluate(TEXT_FIT, [scope, column])
                problems += [f"(tab {index + 1}) {p}" for p in found]
    return list(dict.fromkeys(problems))


def screenshot(tab, name: str) -> None:
    """_build/screenshots/NAME.png of the whole page, when KVLAB_SCREENSHOTS is set."""
    if not os.environ.get("KVLAB_SCREENSHOTS"):
        return
    tab.wait_for_timeout(300)  # let BokehJS finish rendering
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise RuntimeError(
            "Chromium is not installed: run `make system-deps` (apt-get install -y chromium)"
        )
    return path


ZH = "zh"  # the Chinese edition's folder inside the site (_config.yml kvlab_editions)


def ensure_site() -> Path:
    """Reuse _build/html (and its Chinese edition, _build/html/zh) when `make book` built
    them, else build both the way `make book` does (warnings as errors)."""
    if not ((SITE / "index.html").exists() and (SITE / ZH / "index.html").exists()):
        subprocess.run(["make", "book"], check=True, cwd=ROOT)
    return SITE


def page_language(page: str) -> str:
    """'zh_CN' for a page of the Chinese edition, else 'en'."""
    return "zh_CN" if page.startswith(f"{ZH}/") else "en"


@contextlib.contextmanager
def edition(language: str):
    """Python computes as it did for that edition's build (KVLAB_BOOK_LANG)."""
    before = os.environ.get("KVLAB_BOOK_LANG")
    if language == "en":
        os.environ.pop("KVLAB_BOOK_LANG", None)
    else:
        os.environ["KVLAB_BOOK_LANG"] = language
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KVLAB_BOOK_LANG", None)
        else:
            os.environ["KVLAB_BOOK_LANG"] = before


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(folder: Path):
    """Serve a folder on 127.0.0.1 on a free port; yields the base URL."""
    handler = functools.partial(_Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def site_pages() -> list[str]:
    """Every HTML page of the built book, both editions (relative paths; zh/... Chinese)."""
    if not SITE.exists():
        return []
    pages = []
    for path in sorted(SITE.rglob("*.html")):
        rel = path.relative_to(SITE).as_posix()
        if rel.startswith(
            (
                "_static/",
                "_sources/",
                "_images/",
                f"{ZH}/_static/",
                f"{ZH}/_sources/",
                f"{ZH}/_images/",
            )
        ):
            continue
        pages.append(rel)
    return pages


def page_panels() -> list[tuple[str, str]]:
    """(page, panel key) for every static panel the built book embeds."""

    found = []
    for page in site_pages():
        text = (SITE / page).read_text(encoding="utf-8")
        for key in re.findall(r'class="kvlab-panel" data-panel="([\w-]+)"', text):
            found.append((page, key))
    return found


def bokeh_pages() -> list[str]:
    """Every page of the built book (both editions) that embeds bokeh figures or panels."""
    return [page for page in site_pages() if "data-root-id=" in (SITE / page).read_text("utf-8")]
