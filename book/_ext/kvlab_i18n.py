"""The book's editions: English (the source) and Chinese (Sphinx gettext catalogues).

`make book` builds the English site into _build/html/ and then the Chinese one, with a
configuration derived from _config.yml by `python book/_ext/kvlab_i18n.py config zh_CN
OUT.yml` (language, locale folder, title, author), into _build/zh/_build/html/, copied to
_build/html/zh/. The editions are listed in _config.yml (`kvlab_editions`).

Translators edit locale/zh_CN/LC_MESSAGES/<docname>.po and write glued numbers as in the
English, {glue:text}`key`. Sphinx re-parses a translated paragraph as a new document that
has none of myst-nb's glue data, so before the Chinese build reads a page this extension
compiles every .po into a .mo under the build folder with each such role rewritten into
the cross-document form myst-nb resolves from its glue cache, {glue:text}`PAGE.ipynb::key:s`
(the same value the English page shows). It also checks that a translation keeps every
glue key of its English (a number cannot go missing or change key), and lets a
translation link more glossary terms than its English ({term}`...` on first use).

Every page gets a link to its twin in the other edition (html-page-context).
"""

from __future__ import annotations

import copy
import gettext
import html
import re
import sys
from pathlib import Path

LANG_ENV = "KVLAB_BOOK_LANG"
LOCALE_DIR = "locale"  # translators' catalogues, relative to the book's root
GLUE_ROLE = re.compile(r"\{glue(?::(text|any|md))?\}`([^`]*)`")
TERM_ROLE = re.compile(r"\{term\}`")
SOURCE_SUFFIXES = (".ipynb", ".md")


# ------------------------------------------------------------------ catalogues
def glue_keys(text: str) -> list[str]:
    """The glue keys a message uses, sorted (a cross-document role counts by its key)."""
    keys = []
    for _kind, body in GLUE_ROLE.findall(text):
        key = body.split("::", 1)[-1]
        keys.append(key.rsplit(":", 1)[0] if ":" in key else key)
    return sorted(keys)


def rewrite_glue(text: str, source: str) -> str:
    """Every local glue role of a translated message, as a cross-document role into
    `source` (the page's own file name, with its extension)."""

    def one(match: re.Match) -> str:
        kind, body = match.group(1) or "any", match.group(2)
        if "::" in body:
            return match.group(0)
        if kind == "md":
            raise ValueError(f"{{glue:md}}`{body}` cannot be translated: use {{glue:text}}")
        if kind == "text":
            key, fmt = body.rsplit(":", 1) if ":" in body else (body, "s")
            return f"{{glue:text}}`{source}::{key}:{fmt}`"
        return f"{{glue:any}}`{source}::{body}`"

    return GLUE_ROLE.sub(one, text)


def _source_of(root: Path, docname: str) -> str:
    """The page's file name as a glue role in that page names it (relative to its folder)."""
    for suffix in SOURCE_SUFFIXES:
        if (root / f"{docname}{suffix}").exists():
            return f"{Path(docname).name}{suffix}"
    raise FileNotFoundError(f"no page {docname} ({'/'.join(SOURCE_SUFFIXES)}) for its catalogue")


def compile_catalogs(root: Path, language: str, out: Path) -> list[str]:
    """Compile LOCALE_DIR/<language>/LC_MESSAGES/**/*.po into `out` (same layout) with the
    glue roles rewritten; fuzzy entries are left out (the English shows). Returns the
    problems found (each names the catalogue and the message)."""
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    folder = root / LOCALE_DIR / language / "LC_MESSAGES"
    problems = []
    for po in sorted(folder.rglob("*.po")):
        docname = po.relative_to(folder).with_suffix("").as_posix()
        source = _source_of(root, docname)
        with po.open("rb") as handle:
            catalog = read_po(handle, locale=language, domain=docname)
        for message in catalog:
            if not message.id or not message.string or message.fuzzy:
                continue
            where = f"{po.relative_to(root)}: {str(message.id)[:60]!r}"
            if glue_keys(message.string) != glue_keys(message.id):
                problems.append(
                    f"{where}: the translation's glued numbers "
                    f"{glue_keys(message.string)} differ from the English "
                    f"{glue_keys(message.id)}"
                )
                message.string = ""
                continue
            try:
                message.string = rewrite_glue(message.string, source)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
                message.string = ""
                continue
            if len(TERM_ROLE.findall(message.string)) > len(TERM_ROLE.findall(message.id)):
                message.string += " #noqa"  # glossary links on first use: more than the English
        target = out / language / "LC_MESSAGES" / f"{docname}.mo"
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as handle:
            write_mo(handle, catalog, use_fuzzy=False)
    return problems


# ------------------------------------------------------------------ configuration
def edition_config(config: dict, language: str, root: Path) -> dict:
    """The Chinese build's _config.yml: the English one plus its language settings (local
    extensions by absolute path: Jupyter Book takes them relative to the config file)."""

    edition = config["sphinx"]["config"]["kvlab_editions"][language]
    derived = copy.deepcopy(config)
    extensions = derived["sphinx"].get("local_extensions") or {}
    derived["sphinx"]["local_extensions"] = {
        name: str((root / path).resolve()) for name, path in extensions.items()
    }
    derived["title"] = edition.get("title", derived.get("title"))
    derived["author"] = edition.get("author", derived.get("author"))  # the footer's "作者："
    settings = derived["sphinx"]["config"]
    settings["language"] = language
    settings["locale_dirs"] = []  # set by builder-inited to the compiled catalogues
    settings.update(edition.get("sphinx_config") or {})  # e.g. myst-nb's "Show code" buttons
    return derived


def write_edition_config(source: Path, language: str, target: Path) -> None:
    import yaml

    config = yaml.safe_load(source.read_text(encoding="utf-8"))
    target.parent.mkdir(parents=True, exist_ok=True)
    derived = edition_config(config, language, source.parent)
    text = yaml.safe_dump(derived, allow_unicode=True, sort_keys=False)
    target.write_text(
        f"# Generated by book/_ext/kvlab_i18n.py from {source.name}: do not edit.\n{text}",
        encoding="utf-8",
    )


# ------------------------------------------------------------------ Sphinx
def _edition(app) -> str:
    language = (app.config.language or "en").replace("-", "_")
    return language if language in app.config.kvlab_editions else "en"


def _builder_inited(app) -> None:
    from sphinx.errors import ConfigError
    from sphinx.util import logging

    edition = _edition(app)
    if edition == "en" or app.builder.name == "gettext":
        return
    out = Path(app.outdir).parent / "locale"
    problems = compile_catalogs(Path(app.srcdir), edition, out)
    for problem in problems:
        logging.getLogger(__name__).warning(problem)
    if not out.exists():
        raise ConfigError(f"no catalogues for {edition} in {LOCALE_DIR}/{edition}/LC_MESSAGES")
    app.config.locale_dirs = [str(out.resolve())]


def _translate_captions(app, doctree) -> None:
    """Toctree captions that sphinx-external-toc inserts after Sphinx's own translation step
    ("The book", "Using kvlab"), from the page's catalogue."""

    from sphinx import addnodes

    if _edition(app) == "en" or not app.config.locale_dirs:
        return
    translations = gettext.translation(
        app.env.docname, app.config.locale_dirs[0], [_edition(app)], fallback=True
    )
    for node in doctree.findall(addnodes.toctree):
        if node.get("caption"):
            node["caption"] = translations.gettext(node["caption"])


def _translate_math_blocks(app, document) -> None:
    """Display math ($$ ... $$) from the page's catalogue, before Sphinx's own translation
    step: that step re-parses a translated literal-type block as reST ('::' and an indented
    block), which MyST reads as a paragraph '::', so the formula would become '::'. The
    block's text is replaced here as it stands in the .po (its \\text{} translated), and
    Sphinx then finds nothing left to translate in it."""

    from docutils import nodes

    if _edition(app) == "en" or not app.config.locale_dirs:
        return
    translations = gettext.translation(
        app.env.docname, app.config.locale_dirs[0], [_edition(app)], fallback=True
    )
    for node in document.findall(nodes.math_block):
        msg = node.rawsource or node.astext()
        msgstr = translations.gettext(msg)
        if msgstr and msgstr != msg:
            node.rawsource = msgstr
            node.children = []
            node += nodes.Text(msgstr)


def twin_links(app, pagename: str) -> list[tuple[str, str, str]]:
    """(language, label, relative URL) of this page in each other edition."""
    editions = app.config.kvlab_editions
    here = _edition(app)
    up = "../" * pagename.count("/") + ("../" if editions[here]["path"] not in ("", ".") else "")
    links = []
    for language, edition in editions.items():
        if language == here:
            continue
        folder = "" if edition["path"] in ("", ".") else edition["path"].strip("/") + "/"
        links.append((language, edition["link"], f"{up}{folder}{pagename}.html"))
    return links


def _tag(language: str) -> str:
    """'zh_CN' as HTML writes it: 'zh-CN'."""
    return language.replace("_", "-")


def _page_context(app, pagename, templatename, context, doctree) -> None:
    if not app.config.kvlab_editions or "body" not in context:
        return
    links = twin_links(app, pagename)
    anchors = "".join(
        f'<a class="kvlab-lang-link" hreflang="{_tag(lang)}" lang="{_tag(lang)}" '
        f'href="{html.escape(url)}">{html.escape(label)}</a>'
        for lang, label, url in links
    )
    context["body"] = f'<p class="kvlab-lang">{anchors}</p>' + context["body"]
    context["metatags"] = context.get("metatags", "") + "".join(
        f'<link rel="alternate" hreflang="{_tag(lang)}" href="{html.escape(url)}" />\n'
        for lang, _label, url in links
    )


def setup(app):
    from sphinx.transforms import SphinxTransform

    class MathBlocks(SphinxTransform):
        default_priority = 19  # just before sphinx.transforms.i18n.Locale (20)

        def apply(self, **kwargs) -> None:
            _translate_math_blocks(self.app, self.document)

    app.add_config_value("kvlab_editions", {}, "html")
    app.add_transform(MathBlocks)
    app.connect("builder-inited", _builder_inited)
    app.connect("doctree-read", _translate_captions)
    app.connect("html-page-context", _page_context)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}


def main(argv: list[str]) -> int:
    """`config LANGUAGE OUT.yml`: write the edition's configuration derived from _config.yml."""
    if len(argv) != 3 or argv[0] != "config":
        print("usage: kvlab_i18n.py config LANGUAGE OUT.yml", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parents[2]
    write_edition_config(root / "_config.yml", argv[1], Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
