"""`python -m kvlab.kernel_tables extract [--out DIR]`: regenerate the measured kernel extract."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import KvlabError
from .extract import extract


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvlab.kernel_tables",
        description="Regenerate kvlab's measured kernel tables "
        "from aiconfigurator-core (needs the 'measured' extra).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="write the extract (default: kvlab/data/kernel_tables)")
    ex.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "data" / "kernel_tables",
        help="output folder",
    )
    args = parser.parse_args(argv)

    try:
        for path in extract(args.out):
            print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    except KvlabError as exc:
        print(f"python -m kvlab.kernel_tables: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
