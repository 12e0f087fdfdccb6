"""Sphinx glue that keeps the built book offline and light.

- BokehJS is copied once per site from the installed bokeh (so its version always
  matches the Python side), with kvlab's own browser code (kvlab/viz/js/*.js: the library
  and every panel's function, as one script named by its content hash so a rebuilt site
  is never served a stale copy), and both are loaded only on pages that embed a bokeh
  figure.
- MathJax 3 comes from the npm registry once per build folder (`npm pack`), so math
  renders without a CDN.
- Notebooks are re-executed on every build, even when their text did not change.
- Sphinx 7.4 emits sphinx-thebe's inline script twice ("Identifier 'THEBE_JS_URL' has
  already been declared"); duplicates are dropped per page.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from kvlab.viz import i18n
from kvlab.viz.panel import kvlab_js

MATHJAX_VERSION = "3.2.2"
BOKEH_FILES = ("bokeh.min.js", "bokeh-widgets.min.js")


def _vendor_dir(app) -> Path:
    """One vendor folder for every edition (the Chinese build's outdir is _build/zh/_build/html)."""
    return Path(app.srcdir) / "_build" / "vendor"


def _edition_dir(app) -> Path:
    """This edition's own static folder: its kvlab.js differs from the other's (the Chinese
    one carries the label table) and `make book` builds the two editions at once, so
    neither may touch the other's copy."""
    return Path(app.srcdir) / "_build" / f"vendor-{app.config.language or 'en'}"


def _copy_bokeh(static: Path) -> list[str]:
    import bokeh

    source = Path(bokeh.__file__).parent / "server" / "static" / "js"
    names = []
    for name in BOKEH_FILES:
        target = static / "kvlab-vendor" / name.replace(".min.js", f"-{bokeh.__version__}.min.js")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.copyfile(source / name, target)
        names.append(f"kvlab-vendor/{target.name}")
    for old in (static / "kvlab-vendor").glob("kvlab-*.js"):  # from builds before _edition_dir
        old.unlink(missing_ok=True)
    return names


def _write_kvlab_js(folder: Path) -> str:
    """kvlab's browser code (library + every panel's function), once per site."""

    text = kvlab_js() + i18n.browser_js()  # the label table, in the Chinese edition only
    name = f"kvlab-{hashlib.sha256(text.encode()).hexdigest()[:12]}.js"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("kvlab*.js"):  # earlier builds' copies would ship with the site
        if old.name != name:
            old.unlink()
    (folder / name).write_text(text)
    return f"kvlab-vendor/{name}"


def _fetch_mathjax(static: Path) -> None:
    target = static / "mathjax"
    if (target / "tex-chtml.js").exists():
        return
    keep = (
        "package/es5/tex-chtml.js",
        "package/es5/output/chtml/fonts/woff-v2/",
        "package/es5/input/tex/extensions/",
        "package/es5/ui/",
        "package/es5/a11y/",
    )
    static.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=static, prefix=".mathjax-") as tmp:
        try:
            out = subprocess.run(
                [
                    "npm",
                    "pack",
                    f"mathjax@{MATHJAX_VERSION}",
                    "--silent",
                    "--pack-destination",
                    tmp,
                ],
                check=True,
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(
                f"kvlab book: could not fetch MathJax {MATHJAX_VERSION} with npm ({exc}); "
                "install Node.js/npm or place MathJax's es5 folder in "
                f"{target}"
            ) from exc
        tarball = Path(tmp) / out.stdout.strip().splitlines()[-1]
        with tarfile.open(tarball) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(keep)]
            tar.extractall(tmp, members=members, filter="data")
        # The editions build at once: each unpacks beside the target and renames it into
        # place; the second one finds it there and drops its own copy.
        staged = Path(tmp) / "package" / "es5"
        try:
            staged.rename(target)
        except OSError:
            if not (target / "tex-chtml.js").exists():
                shutil.copytree(staged, target, dirs_exist_ok=True)


def _builder_inited(app) -> None:
    if app.builder.format != "html":
        return
    static, own = _vendor_dir(app), _edition_dir(app)
    app.env.kvlab_bokeh_js = [_write_kvlab_js(own / "kvlab-vendor"), *_copy_bokeh(static)]
    _fetch_mathjax(static)
    app.config.html_static_path.extend([str(static), str(own)])


def _page_context(app, pagename, templatename, context, doctree) -> None:
    body = context.get("body", "")
    if "Bokeh.embed" in body or "BokehJS" in body:
        for name in getattr(app.env, "kvlab_bokeh_js", ()):
            app.add_js_file(name, priority=400)
    scripts = context.get("script_files")
    if scripts:
        seen, unique = set(), []
        for script in scripts:
            key = (
                str(getattr(script, "filename", script) or ""),
                getattr(script, "attributes", {}).get("body", ""),
            )
            if key not in seen:
                seen.add(key)
                unique.append(script)
        context["script_files"] = unique


def _always_reexecute(app, env, added, changed, removed):
    """Re-read (and so re-execute) every notebook on every build: their numbers come from
    kvlab, whose code Sphinx does not watch, so a cached page could show stale figures."""
    return [doc for doc in env.found_docs if str(env.doc2path(doc)).endswith(".ipynb")]


def setup(app):
    app.connect("builder-inited", _builder_inited)
    app.connect("env-get-outdated", _always_reexecute)
    app.connect("html-page-context", _page_context, priority=900)
    app.config.mathjax_path = "mathjax/tex-chtml.js"
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
