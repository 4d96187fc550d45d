#!/usr/bin/env python3
"""Writes the NKI API table (tern.nki._api_table) into docs/nki.md between
its api-table markers; --check fails when the file is out of date.

    PYTHONPATH=build/python /usr/bin/python3 scripts/nki_api_table.py [--check]
"""
import argparse
import os
import sys

from tern.nki import _api_table

BEGIN, END = "<!-- api-table:begin -->\n", "<!-- api-table:end -->"


def render(text):
    a = text.index(BEGIN) + len(BEGIN)
    b = text.index(END)
    return text[:a] + _api_table.table() + text[b:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if docs/nki.md differs")
    ap.add_argument("--doc", default=os.path.join(os.path.dirname(__file__), "..", "docs", "nki.md"))
    args = ap.parse_args()
    text = open(args.doc, encoding="utf-8").read()
    new = render(text)
    if args.check:
        if new != text:
            sys.exit(f"{args.doc}: the API table is out of date; run scripts/nki_api_table.py")
        return
    tmp = args.doc + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, args.doc)


if __name__ == "__main__":
    main()
