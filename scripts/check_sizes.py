"""Size budget: source files and function bodies stay small enough to read.

    /usr/bin/python3 scripts/check_sizes.py [--root DIR] [--list N]

Checks, under DIR (the repository root by default):
  - every .h/.cpp under src/ and every .py under python/, scripts/, bench/
    is at most --file-lines lines (800);
  - every function body defined in src/train/ and src/runtime/ spans at
    most --function-lines lines (120), counted from the first line of its
    signature to its closing brace.

Functions are found by brace matching on clang-formatted C++: a `{` that
follows a `)` (optionally `const`, `noexcept`, `override`, a trailing return
type or a constructor's initializer list) outside any other function body
opens a function; braces inside strings, character literals and comments
are ignored. Lambdas are counted as part of the function that holds them.

    --list N   also print the N longest functions of all of src/ (a survey)

Exit status: 0 within budget (one summary line), 1 over it (one line per
offender, file:line and the count), 2 when the tree cannot be read.
"""
import argparse
import pathlib
import re
import sys

CPP_SUFFIXES = {".h", ".cpp"}
BUDGETED_FUNCTION_DIRS = ("src/train", "src/runtime")
SCOPE_RE = re.compile(r"\b(namespace|struct|class|union|enum)\b[^;()]*$")
SIGNATURE_TAIL_RE = re.compile(
    r"\)\s*(const|noexcept|override|final|mutable|&|&&|\s)*(->\s*[\w:<>,\s\*&]+)?$")


def strip_code(text):
    """Blanks string/char literals and comments, keeping newlines."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            j = n if end < 0 else end + len(m.group(1) if m else "") + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j + 1, n) - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """Yields (first line, line count, signature) of each function body."""
    text = strip_code(path.read_text(encoding="utf-8", errors="replace"))
    lines = text.split("\n")
    stack = []  # one entry per open brace: ("scope"|"func"|"block", start line)
    prefix = ""  # code since the last ';', '{' or '}' at scope level
    prefix_line = 0
    for no, line in enumerate(lines):
        for ch in line:
            in_func = any(kind == "func" for kind, _ in stack)
            if ch == "{":
                head = prefix.strip()
                if in_func:
                    stack.append(("block", no))
                elif SCOPE_RE.search(head) or not head or head.endswith("="):
                    stack.append(("scope", no))
                elif SIGNATURE_TAIL_RE.search(head) or re.search(r"\)\s*:", head):
                    stack.append(("func", prefix_line))
                else:
                    stack.append(("scope", no))
                prefix, prefix_line = "", no
            elif ch == "}":
                if stack:
                    kind, start = stack.pop()
                    if kind == "func":
                        yield start + 1, no - start + 1, head_of(lines, start)
                prefix, prefix_line = "", no
            elif ch == ";" and not any(kind == "func" for kind, _ in stack):
                prefix, prefix_line = "", no + 1
            else:
                if not prefix.strip() and not ch.isspace():
                    prefix_line = no
                prefix += ch
        prefix += "\n"


def head_of(lines, start):
    return lines[start].strip()[:80]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--file-lines", type=int, default=800)
    ap.add_argument("--function-lines", type=int, default=120)
    ap.add_argument("--list", type=int, default=0, metavar="N")
    a = ap.parse_args()
    root = pathlib.Path(a.root)
    if not (root / "src").is_dir():
        print(f"check_sizes: no src/ under {root}", file=sys.stderr)
        return 2
    files = sorted(p for p in (root / "src").rglob("*") if p.suffix in CPP_SUFFIXES)
    py = sorted(p for d in ("python", "scripts", "bench") for p in (root / d).rglob("*.py"))
    bad = []
    for p in files + py:
        n = len(p.read_text(encoding="utf-8", errors="replace").splitlines())
        if n > a.file_lines:
            bad.append(f"{p.relative_to(root)}: {n} lines (file budget {a.file_lines})")
    survey, budgeted = [], 0
    for p in files:
        rel = p.relative_to(root).as_posix()
        for line, count, sig in functions(p):
            survey.append((count, f"{rel}:{line}", sig))
            if rel.startswith(BUDGETED_FUNCTION_DIRS):
                budgeted += 1
                if count > a.function_lines:
                    bad.append(f"{rel}:{line}: function of {count} lines "
                               f"(budget {a.function_lines}): {sig}")
    for count, where, sig in sorted(survey, reverse=True)[: a.list]:
        print(f"{count:5d}  {where}  {sig}")
    for b in bad:
        print(b)
    if bad:
        return 1
    print(f"check_sizes: {len(files) + len(py)} files within {a.file_lines} lines; "
          f"{budgeted} functions in train/ and runtime/ within {a.function_lines} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
