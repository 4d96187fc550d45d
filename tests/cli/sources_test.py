"""Every bracketed source tag the hardware and planner data cite ([T3],
[NKI], ...) has its entry ("### [TAG] title") in docs/sources.md, and every
entry there is cited by some data file.

    /usr/bin/python3 tests/cli/sources_test.py ROOT
"""
import pathlib
import re
import sys


def cited_tags(root):
    tags = set()
    for f in (root / "data").rglob("*"):
        if f.is_file() and f.suffix in (".toml", ".json", ".csv", ".md", ""):
            for line in f.read_text(errors="replace").splitlines():
                if "#" in line:
                    tags.update(re.findall(r"\[([A-Z][A-Za-z0-9]+)\]", line.split("#", 1)[1]))
    return tags


def listed_tags(root):
    text = (root / "docs" / "sources.md").read_text()
    return set(re.findall(r"^### \[([A-Za-z0-9]+)\]", text, flags=re.M))


def main():
    root = pathlib.Path(sys.argv[1])
    cited, listed = cited_tags(root), listed_tags(root)
    missing, unused = sorted(cited - listed), sorted(listed - cited)
    for t in missing:
        print("docs/sources.md has no entry for [%s], which data/ cites" % t)
    for t in unused:
        print("docs/sources.md lists [%s], which no file in data/ cites" % t)
    if missing or unused:
        return 1
    print("sources: %d tags, each listed once and cited" % len(cited))
    return 0


if __name__ == "__main__":
    sys.exit(main())
