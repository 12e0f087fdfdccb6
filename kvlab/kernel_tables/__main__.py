"""`python -m kvlab.kernel_tables extract [--out DIR]`: regenerate the measured kernel extract.

The default DIR is `kvlab/data/kernel_tables` under the current folder: the committed copy,
when run from the root of a kvlab checkout (an installed package's data is not rewritten)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import KvlabError
from .extract import extract

#: Where the extract is committed, relative to a checkout's root.
DEFAULT_OUT = Path("kvlab") / "data" / "kernel_tables"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvlab.kernel_tables",
        description="Regenerate kvlab's measured kernel tables "
        "from aiconfigurator-core (needs the 'measured' extra).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help=f"write the extract (default: ./{DEFAULT_OUT})")
    ex.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output folder (default ./{DEFAULT_OUT}: run from the checkout's root)",
    )
    args = parser.parse_args(argv)

    try:
        out = args.out
        if out is None:
            out = DEFAULT_OUT
            if not out.parent.is_dir():
                raise KvlabError(
                    f"no {out.parent}/ under {Path.cwd()}: run from the root of a kvlab "
                    "checkout, or name the folder with --out DIR"
                )
        for path in extract(out):
            print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    except KvlabError as exc:
        print(f"python -m kvlab.kernel_tables: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
