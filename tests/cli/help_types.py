"""Every option of every tern command is typed, and refuses bad values at parse time.

Walks `tern --help` and each subcommand's help, recursively. Fails on an
option whose value type is TEXT but whose default is a number or a boolean,
or whose type is a bare INT / UINT (no range). Then, for every typed option,
gives it a value outside its type (below an integer's minimum, above its
maximum, a word for a number, nan for a float, an unknown choice) and checks
that tern exits non-zero with one error line that names the option and the
type it wanted, before doing any work.

    /usr/bin/python3 tests/cli/help_types.py build/tern
"""
import re
import subprocess
import sys

TERN = sys.argv[1]
OPTION = re.compile(r"^  (?:-\w,)?(--[\w-]+)(?: (.*))?$")
TYPE = re.compile(r"^(INT in \[[^\]]*\]|INT >= [^=\s]+|FLOAT in \[[^\]]*\]|FLOAT >= [^=\s]+|\{[^}]*\}|[A-Z]+)"
                  r"(?:=(\S+))?(?: \.\.\.)?(?:\s|$)")


def run(args):
    return subprocess.run([TERN, *args], capture_output=True, text=True, timeout=60)


def commands(path=()):
    out = run([*path, "--help"]).stdout
    yield path, out
    subs = False
    for line in out.splitlines():
        if line.startswith("Subcommands:"):
            subs = True
        elif subs and re.match(r"^  [a-z]", line):
            yield from commands((*path, line.split()[0]))


def options(help_text):
    """(name, type) of each option line; type '' for a flag."""
    in_opts = False
    for line in help_text.splitlines():
        if line.startswith("Options:"):
            in_opts = True
            continue
        if in_opts and line and not line.startswith(" "):
            in_opts = False
        m = OPTION.match(line) if in_opts else None
        if m and m.group(1) not in ("--help", "--version"):
            t = TYPE.match(m.group(2) or "")
            yield m.group(1), (t.group(1), t.group(2) or "") if t else ("", "")


def bad_values(kind):
    """Values outside `kind` (the type text before any '=default')."""
    m = re.match(r"^INT in \[(-?\d+), (-?\d+)\]$", kind)
    if m:
        return [str(int(m.group(1)) - 1), str(int(m.group(2)) + 1), "abc"]
    m = re.match(r"^INT >= (-?\d+)$", kind)
    if m:
        return [str(int(m.group(1)) - 1), "99999999999999999999", "1.5"]
    m = re.match(r"^FLOAT(?: in \[(\S+), (\S+)\]| >= (\S+))?$", kind)
    if m:
        vals = ["nan", "inf", "abc"]
        low = m.group(1) or m.group(3)
        if low is not None:
            vals.append(repr(float(low) - 1.0))
        return vals
    if kind.startswith("{") or kind in ("BOOL", "DTYPE"):
        return ["no-such-choice"]
    return []


def main():
    failures, tried, seen = [], 0, 0
    for path, text in commands():
        where = "tern " + " ".join(path)
        for name, typ in options(text):
            seen += 1
            kind, default = typ
            if kind.startswith("TEXT") and re.match(r"^(-?[\d.]+(e-?\d+)?|true|false)$", default):
                failures.append(f"{where} {name}: TEXT with the default {default} (untyped)")
            if kind in ("INT", "UINT"):
                failures.append(f"{where} {name}: {kind} without a range")
            for v in bad_values(kind):
                tried += 1
                r = run([*path, name, v])
                err = r.stderr.strip()
                if r.returncode == 0:
                    failures.append(f"{where} {name} {v}: accepted")
                elif name not in err or "error" not in err:
                    failures.append(f"{where} {name} {v}: unclear error: {err[:200]!r}")
                elif kind.startswith(("INT", "FLOAT", "{")) and kind not in err:
                    failures.append(f"{where} {name} {v}: the error does not name {kind}: {err}")
                elif len(err.splitlines()) != 1:
                    failures.append(f"{where} {name} {v}: more than one line: {err[:300]!r}")
    print(f"{seen} options, {tried} bad values tried, {len(failures)} failures")
    for f in failures[:60]:
        print("FAIL:", f)
    if seen < 300 or tried < 300:
        print("FAIL: too few options found: is the help format what this test parses?")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
