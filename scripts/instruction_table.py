#!/usr/bin/env python3
"""Generates the instruction table of docs/architecture.md from the sources.

    /usr/bin/python3 scripts/instruction_table.py                 # print the table
    /usr/bin/python3 scripts/instruction_table.py --check FILE    # exit 1 if FILE is stale
    /usr/bin/python3 scripts/instruction_table.py --write FILE    # rewrite FILE's table

One row per opcode of `enum class Opcode` (src/isa/instruction.h): its enum
comment (engine and meaning), where the functional model implements it (the
`case Opcode::X:` of Simulator::Impl::execute in src/sim/functional_ops.cpp,
followed into the function it calls, into execute_select and the row
functions of src/isa/select_ops.h, or into the sequencer in
src/sim/scheduler.cpp) and where its cost is (the case of CostModel::cycles
in src/sim/cost.cpp with its comment and formula; DMA instructions are timed
by DmaModel::transfer). Links are relative to docs/. The table lives between
the markers `<!-- instruction-table:begin -->` and `<!-- instruction-table:end -->`.
Missing cells print as "—" and are reported on stderr.
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- instruction-table:begin -->", "<!-- instruction-table:end -->"
INSTRUCTION_H = "src/isa/instruction.h"
FUNCTIONAL = "src/sim/functional_ops.cpp"
SELECT_H = "src/isa/select_ops.h"
SIMULATOR = "src/sim/scheduler.cpp"
COST = "src/sim/cost.cpp"
DMA_COST = ("rows over the core's DMA engines, each (descriptor overhead + row bytes) / engine "
            "bandwidth, HBM bandwidth shared, plus a fixed cost; a queue completes in order")
MISSING = "—"
CASE_RE = re.compile(r"^(\s*)(?:case Opcode::(\w+)|(default)):(.*)$")
ENGINE_RE = re.compile(r"^[A-Za-z][\w /()]*:")


def read(rel):
    return (ROOT / rel).read_text(encoding="utf-8").splitlines()


def link(rel, line, label):
    return f"[{pathlib.Path(rel).name}:{line} {label}](../{rel}#L{line})"


def comment_of(text):
    """The // comment on a line, or ''."""
    m = re.search(r"//\s?(.*)$", text)
    return m.group(1).strip() if m else ""


def sentence(comments):
    return " ".join(comments).strip().rstrip(".")


# ---------------------------------------------------------------- the enum

def enum_lines():
    lines = read(INSTRUCTION_H)
    start = next(i for i, l in enumerate(lines) if "enum class Opcode" in l)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("};"))
    return [(i + 1, lines[i]) for i in range(start + 1, end)]


def opcodes():
    """[(name, line, meaning)] in enum order, without count_.

    An enumerator's comment is its trailing comment (continued on deeper
    indented comment lines), else the comment block just before it. A block
    before an enumerator that has its own comment is a group header."""
    out, pending, header = [], [], ""
    for no, text in enum_lines():
        if text.strip().startswith("//"):
            prev = out[-1] if out else None
            if prev and prev["trailing"] and not pending and indent(text) > prev["indent"]:
                prev["comment"].append(comment_of(text))
            else:
                pending.append(comment_of(text))
            continue
        m = re.match(r"^(\s*)(\w+)\s*,?\s*(//.*)?$", text)
        if m and m.group(2) != "count_":
            trailing = comment_of(m.group(3) or "")
            header = " ".join(pending) if trailing and pending else header
            out.append({"name": m.group(2), "line": no, "indent": len(m.group(1)),
                        "trailing": bool(trailing), "comment": [trailing] if trailing else pending,
                        "header": header if trailing else ""})
        pending = []
    return [(e["name"], e["line"], meaning(" ".join(e["comment"]), e["header"])) for e in out]


def indent(text):
    return len(text) - len(text.lstrip())


def meaning(comment, header):
    """The comment's first clause, prefixed with its group header when it names no engine."""
    text = re.split(r";\s|\.\s", comment.strip(), maxsplit=1)[0].rstrip(".")
    if header and not ENGINE_RE.match(text):
        text = f"{re.split(r'[:.]', header)[0]}: {text}"
    return text


# ---------------------------------------------------------------- C++ parsing

def function_body(rel, name):
    """(lines, first line number) of the definition of `name` (e.g. CostModel::cycles)."""
    lines = read(rel)
    pat = re.compile(rf"^\S.*\b{re.escape(name)}\(")
    for i, text in enumerate(lines):
        if pat.match(text) and not text.rstrip().endswith(";"):
            end = next(j for j in range(i, len(lines)) if lines[j].startswith("}"))
            return lines[i:end + 1], i + 1
    return [], 0


def case_groups(lines, first):
    """[{labels: {op: line}, first: line, label_comments, body: [(line, text)]}]."""
    groups, cur, label_indent = [], None, None
    for k, text in enumerate(lines):
        no, m = first + k, CASE_RE.match(text)
        if m and (label_indent is None or len(m.group(1)) == label_indent):
            label_indent = len(m.group(1))
            if cur is None or cur["body"]:
                cur = {"labels": {}, "first": no, "label_comments": [], "body": []}
                groups.append(cur)
            cur["labels"][m.group(2) or "default"] = no
            if comment_of(m.group(4)):
                cur["label_comments"].append(comment_of(m.group(4)))
        elif cur is not None and (indent(text) > label_indent or
                                  (text.strip() == "}" and indent(text) == label_indent)):
            cur["body"].append((no, text))
    return groups


def group_of(groups, op):
    return next((g for g in groups if op in g["labels"]), None)


def definitions(paths):
    """{function: (file, line)} for the Simulator::Impl members defined in paths."""
    defs = {}
    for rel in paths:
        for i, text in enumerate(read(rel)):
            m = re.match(r"^\S.*\bSimulator::Impl::(\w+)\(", text)
            if m:
                defs.setdefault(m.group(1), (rel, i + 1))
    return defs


def declarations(rel):
    """{function: line} for the free functions declared in a header."""
    out = {}
    for i, text in enumerate(read(rel)):
        m = re.match(r"^[\w:<>]+\s+\**(\w+)\(", text)
        if m:
            out.setdefault(m.group(1), i + 1)
    return out


def enclosing_function(rel, line):
    lines = read(rel)
    for i in range(line - 1, -1, -1):
        m = re.match(r"^[A-Za-z].*?\b([\w:]+)\(", lines[i])
        if m and not lines[i].startswith(("namespace", "using", "#")):
            return m.group(1)
    return "?"


# ---------------------------------------------------------------- semantics

class Semantics:
    def __init__(self):
        files = sorted((ROOT / "src/sim").glob("functional*.cpp"))
        self.defs = definitions([str(f.relative_to(ROOT)) for f in files])
        body, first = function_body(FUNCTIONAL, "Simulator::Impl::execute")
        self.execute = case_groups(body, first)
        self.row_fns = declarations(SELECT_H)
        body, first = function_body(SIMULATOR, "sequencer")
        self.sequencer = case_groups(body, first)

    def cell(self, op):
        g = group_of(self.execute, op)
        if g is None:
            return MISSING
        call = called(g)
        if call is None:
            if all(t.strip() == "break;" for _, t in g["body"]):
                return self.scheduler(op)
            return link(FUNCTIONAL, g["first"], "execute (inline)")
        return self.follow(op, call)

    def follow(self, op, fn):
        if fn not in self.defs:
            return MISSING
        rel, line = self.defs[fn]
        body, first = function_body(rel, f"Simulator::Impl::{fn}")
        inner = group_of(case_groups(body, first), op)
        if inner is None:
            return link(rel, line, fn)
        call = called(inner)
        if call:
            return self.follow(op, call)
        rows = self.row_calls(op, inner)
        text = link(rel, inner["first"], fn)
        return text + "".join(" → " + link(SELECT_H, self.row_fns[r], f"isa::{r}") for r in rows)

    def row_calls(self, op, group):
        calls = (f for _, t in group["body"] for f in re.findall(r"isa::(\w+)\(", t))
        found = [f for f in calls if f in self.row_fns]
        own = [f for f in found if f.startswith(op)]
        return own or (found if len(set(found)) == 1 else [])

    def scheduler(self, op):
        g = group_of(self.sequencer, op)
        if g:
            return link(SIMULATOR, g["first"], "sequencer")
        for i, text in enumerate(read(SIMULATOR)):
            if f"Opcode::{op}" in text:
                return link(SIMULATOR, i + 1, f"{enclosing_function(SIMULATOR, i + 1)} (scheduler)")
        return MISSING


def called(group):
    """The function a case calls with the dispatch signature (core, in), or None."""
    for _, text in group["body"]:
        m = re.search(r"\b(\w+)\(core, in\)", text)
        if m:
            return m.group(1)
    return None


# ---------------------------------------------------------------- cost

class Cost:
    def __init__(self):
        self.body, self.first = function_body(COST, "CostModel::cycles")
        self.groups = case_groups(self.body, self.first)
        self.dma = dma_opcodes()
        _, self.transfer = function_body(COST, "DmaModel::transfer")

    def cell(self, op):
        g = group_of(self.groups, op)
        if g:
            return describe(link(COST, g["first"], "cycles"), g["label_comments"], g["body"])
        early = self.early_return(op)
        if early:
            return early
        if op in self.dma and self.transfer:
            return f"{link(COST, self.transfer, 'DmaModel::transfer')}: {DMA_COST}"
        g = group_of(self.groups, "default")
        if g:
            return describe(link(COST, g["labels"]["default"], "cycles (default)"), [], g["body"])
        return MISSING

    def early_return(self, op):
        """An `if (in.op == Opcode::X ...) { return ...; }` before the switch."""
        for k, text in enumerate(self.body):
            if "switch" in text:
                return None
            if f"Opcode::{op}" in text:
                start = next((j for j in range(k, max(k - 4, -1), -1)
                              if self.body[j].strip().startswith("if")), None)
                if start is None:
                    continue
                block = []
                for j in range(start, len(self.body)):
                    block.append((self.first + j, self.body[j]))
                    if self.body[j].strip() == "}":
                        break
                return describe(link(COST, self.first + start, "cycles"), [], block)
        return None


def dma_opcodes():
    """The opcodes is_dma (and the predicates it calls) accept, from instruction.h."""
    text = "\n".join(read(INSTRUCTION_H))
    def accepts(fn):
        m = re.search(rf"constexpr bool {fn}\(Opcode op\)\s*\{{(.*?)\}}", text, re.S)
        if not m:
            return set()
        ops = set(re.findall(r"Opcode::(\w+)", m.group(1)))
        for inner in re.findall(r"(is_\w+)\(op\)", m.group(1)):
            ops |= accepts(inner)
        return ops
    return accepts("is_dma")


def describe(where, label_comments, body):
    comments = list(label_comments) or first_comment(body)
    formula = first_formula(body)
    parts = [sentence(comments)] if comments else []
    if formula:
        parts.append(f"`{formula}`")
    return where + (": " + "; ".join(parts) if parts else "")


def first_comment(body):
    """The first comment block of a case body (whole-line or trailing)."""
    out = []
    for _, text in body:
        c = comment_of(text)
        if c and (not out or text.strip().startswith("//")):
            out.append(c)
            if not text.strip().startswith("//"):
                break
        elif out:
            break
    return out


def first_formula(body):
    """The first `c = ...;` or `return ...;` of a case body, simplified."""
    for k, (_, text) in enumerate(body):
        s = re.sub(r"//.*$", "", text).strip()
        m = re.match(r"^(?:c = |return )(.*)$", s)
        if not m:
            continue
        expr = m.group(1)
        for _, more in body[k + 1:]:
            if expr.endswith(";"):
                break
            expr += " " + re.sub(r"//.*$", "", more).strip()
        return "c = " + simplify(expr.rstrip(";"))
    return None


def simplify(expr):
    expr = strip_call(expr, "static_cast<double>")
    expr = expr.replace("std::", "").replace(".value()", "")
    return re.sub(r"\s+", " ", expr)


def strip_call(expr, name):
    """Replaces name(x) by x, with balanced parentheses."""
    while (i := expr.find(name + "(")) >= 0:
        j, depth = i + len(name), 0
        for j in range(i + len(name), len(expr)):
            depth += {"(": 1, ")": -1}.get(expr[j], 0)
            if depth == 0:
                break
        expr = expr[:i] + expr[i + len(name) + 1:j] + expr[j + 1:]
    return expr


# ---------------------------------------------------------------- table

def escape(cell):
    return cell.replace("|", "\\|")


def table():
    sem, cost = Semantics(), Cost()
    rows = ["| opcode | engine: meaning | semantics | cost |", "|---|---|---|---|"]
    for op, line, text in opcodes():
        s, c = sem.cell(op), cost.cell(op)
        for what, cell in (("functional semantics", s), ("cost", c)):
            if cell == MISSING:
                print(f"instruction_table: no {what} found for {op}", file=sys.stderr)
        name = f"[`{op}`](../{INSTRUCTION_H}#L{line})"
        rows.append("| " + " | ".join(escape(x) for x in (name, text, s, c)) + " |")
    return "\n".join(rows) + "\n"


def replace_region(text, new_table):
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        sys.exit(f"instruction_table: the markers {BEGIN} ... {END} are missing")
    return text[:a + len(BEGIN)] + "\n" + new_table + text[b:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--check", metavar="FILE", help="exit 1 if FILE's table is out of date")
    group.add_argument("--write", metavar="FILE", help="replace FILE's table")
    args = ap.parse_args()
    generated = table()
    if not (args.check or args.write):
        sys.stdout.write(generated)
        return 0
    path = pathlib.Path(args.check or args.write)
    text = path.read_text(encoding="utf-8")
    new = replace_region(text, generated)
    if args.check:
        if new != text:
            print(f"{path}: the instruction table is out of date; run "
                  f"scripts/instruction_table.py --write {path}", file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
