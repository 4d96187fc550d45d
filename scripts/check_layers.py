"""Layering check: a library may include only the headers of libraries it depends on.

    /usr/bin/python3 scripts/check_layers.py [--root DIR] [--dot|--markdown]

The libraries are the folders under DIR/src (DIR defaults to the repository
root, the parent of this script's folder). Each folder's CMakeLists.txt names
its targets (add_library, add_executable, pybind11_add_module; a folder may
define several, all mapped to that folder) and their project dependencies
(target_link_libraries, PUBLIC, PRIVATE and INTERFACE).

A folder may include the headers of:
  - itself;
  - its direct dependencies (any kind);
  - whatever those expose, i.e. their PUBLIC and INTERFACE dependencies,
    transitively (CMake's usage requirements).

Every .h/.cpp under src/<lib>/ is scanned for `#include "X/..."` where X is a
library folder; <...> includes and includes without a library prefix are
ignored. Cycles in the folder dependency graph are reported too.

Exit status: 0 when clean (one summary line), 1 on violations or cycles,
2 when the tree cannot be read. Notes about CMake constructs that were not
understood go to stderr and do not fail the check.

    --dot        print the folder dependency graph (direct edges) for Graphviz
    --markdown   print the graph as a Markdown list "lib: direct deps"
"""
import argparse
import pathlib
import re
import sys

SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".inl"}
TARGET_COMMANDS = {"add_library", "add_executable", "pybind11_add_module"}
PUBLIC_KEYWORDS = {"PUBLIC", "INTERFACE", "LINK_PUBLIC", "LINK_INTERFACE_LIBRARIES"}
PRIVATE_KEYWORDS = {"PRIVATE", "LINK_PRIVATE"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
COMMAND_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
GENEX_RE = re.compile(r"\$<[^<>:]*:([^<>]*)>")


def note(message):
    print(f"check_layers: note: {message}", file=sys.stderr)


# ---------------------------------------------------------------- CMake parsing

def strip_cmake_comments(text):
    """Drops bracket comments and line comments (outside quoted strings)."""
    text = re.sub(r"#\[(=*)\[.*?\]\1\]", " ", text, flags=re.S)
    out = []
    for line in text.splitlines():
        out.append(re.sub(r'^((?:[^"#]|"[^"]*")*)#.*$', r"\1", line))
    return "\n".join(out)


def matching_paren(text, start):
    """Index of the ')' closing the '(' at text[start], or -1."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def cmake_commands(text):
    """Yields (command name in lower case, argument list, line number)."""
    text = strip_cmake_comments(text)
    pos = 0
    while (m := COMMAND_RE.search(text, pos)):
        end = matching_paren(text, m.end() - 1)
        if end < 0:
            return
        line = text.count("\n", 0, m.start()) + 1
        args = [a.strip('"') for a in text[m.end():end].split()]
        yield m.group(1).lower(), args, line
        pos = end + 1


def unwrap_genex(arg):
    """$<COND:name> -> name (one level); other arguments unchanged."""
    return GENEX_RE.sub(r"\1", arg)


def read_folder_cmake(folder):
    """(targets defined, target_link_libraries calls) of one folder."""
    path = folder / "CMakeLists.txt"
    if not path.is_file():
        note(f"{folder.name}: no CMakeLists.txt, treated as a library without dependencies")
        return [], []
    targets, links = [], []
    for name, args, line in cmake_commands(path.read_text(errors="replace")):
        where = f"src/{folder.name}/CMakeLists.txt:{line}"
        if name in TARGET_COMMANDS and args and "IMPORTED" not in args:
            alias_of = args[2] if args[1:2] == ["ALIAS"] and len(args) > 2 else None
            targets.append((args[0], where, alias_of))
        elif name == "target_link_libraries" and args:
            links.append((args[0], args[1:], where))
    return targets, links


# ---------------------------------------------------------------- the graph

class Graph:
    """Folder-level dependency graph: public and private edges."""

    def __init__(self, folders):
        self.folders = sorted(folders)
        self.public = {f: set() for f in self.folders}
        self.private = {f: set() for f in self.folders}

    def direct(self, folder):
        return (self.public[folder] | self.private[folder]) - {folder}

    def add(self, folder, dep, public):
        if dep != folder:
            (self.public if public else self.private)[folder].add(dep)


def target_owners(cmake):
    """Maps each target name (and alias) to the folder that defines it."""
    owners, aliases = {}, {}
    for folder, (targets, _) in cmake.items():
        for name, where, alias_of in targets:
            if alias_of:
                aliases[name] = alias_of
            elif name in owners:
                note(f"{where}: target {name} already defined in {owners[name]}")
            else:
                owners[name] = folder
    for alias, real in aliases.items():
        if real in owners:
            owners[alias] = owners[real]
    return owners


def link_items(args):
    """Yields (item, is_public) for the arguments after the target name."""
    public = True  # the keyword-less signature: treated as public
    for arg in args:
        if arg in PUBLIC_KEYWORDS:
            public = True
        elif arg in PRIVATE_KEYWORDS:
            public = False
        else:
            yield unwrap_genex(arg), public


def add_link_call(graph, owners, target, args, where):
    folder = owners.get(target)
    if folder is None:
        note(f"{where}: target_link_libraries of unknown target {target!r}, ignored")
        return
    for item, public in link_items(args):
        if "${" in item or "$<" in item:
            note(f"{where}: cannot resolve {item!r}, ignored")
        elif item in owners:
            graph.add(folder, owners[item], public)
        elif item.startswith("tern_"):
            note(f"{where}: {item} is not defined under src/, ignored")


def build_graph(src):
    folders = [p for p in src.iterdir() if p.is_dir()]
    cmake = {f.name: read_folder_cmake(f) for f in folders}
    owners = target_owners(cmake)
    graph = Graph(cmake)
    for _, links in cmake.values():
        for target, args, where in links:
            add_link_call(graph, owners, target, args, where)
    return graph


def public_closure(graph, folder):
    """The folder and everything it exposes through PUBLIC/INTERFACE edges."""
    seen, frontier = {folder}, [folder]
    while frontier:
        for dep in graph.public[frontier.pop()] - seen:
            seen.add(dep)
            frontier.append(dep)
    return seen


def allowed_sets(graph):
    allowed = {}
    for folder in graph.folders:
        allowed[folder] = public_closure(graph, folder)
        for dep in graph.direct(folder):
            allowed[folder] |= public_closure(graph, dep)
    return allowed


def find_cycles(graph):
    """Strongly connected components with more than one folder (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.direct(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph.folders:
        if v not in index:
            visit(v)
    return cycles


def cycle_path(graph, component):
    """One concrete cycle a -> b -> ... -> a inside a strongly connected component."""
    members, start = set(component), component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(graph.direct(path[-1]) & members)
        back = [n for n in nxt if n in seen]
        if back:
            return path[path.index(back[0]):] + [back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


# ---------------------------------------------------------------- includes

def source_files(src, folder):
    for path in sorted((src / folder).rglob("*")):
        if path.suffix in SOURCE_SUFFIXES and path.is_file():
            yield path


def project_includes(path, folders):
    """Yields (line number, header, library) for each `#include "lib/..."`."""
    in_block_comment = False
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if in_block_comment:
            in_block_comment = "*/" not in line
            continue
        m = INCLUDE_RE.match(line)
        if m and "/" in m.group(1) and m.group(1).split("/")[0] in folders:
            yield number, m.group(1), m.group(1).split("/")[0]
        elif line.lstrip().startswith("/*") and "*/" not in line:
            in_block_comment = True


def check_includes(root, src, graph, allowed):
    """Returns (number of project includes checked, violation messages)."""
    folders, checked, violations = set(graph.folders), 0, []
    for folder in graph.folders:
        others = ", ".join(sorted(allowed[folder] - {folder})) or "none"
        for path in source_files(src, folder):
            for number, header, lib in project_includes(path, folders):
                checked += 1
                if lib not in allowed[folder]:
                    violations.append(
                        f"{path.relative_to(root)}:{number}: {folder} includes \"{header}\" "
                        f"but {folder} does not depend on {lib} (allowed: {others})")
    return checked, violations


# ---------------------------------------------------------------- output

def print_dot(graph):
    print("digraph tern_layers {")
    print("  rankdir=BT;")
    print("  node [shape=box];")
    for folder in graph.folders:
        print(f'  "{folder}";')
    for folder in graph.folders:
        for dep in sorted(graph.direct(folder)):
            print(f'  "{folder}" -> "{dep}";')
    print("}")


def print_markdown(graph):
    for folder in graph.folders:
        deps = ", ".join(f"`{d}`" for d in sorted(graph.direct(folder))) or "(none)"
        print(f"- `{folder}`: {deps}")


def run_check(root, src, graph):
    allowed = allowed_sets(graph)
    checked, violations = check_includes(root, src, graph, allowed)
    cycles = find_cycles(graph)
    for message in violations:
        print(message)
    for component in cycles:
        print("layering: dependency cycle: " + " -> ".join(cycle_path(graph, component)))
    if violations or cycles:
        print(f"layering: {len(graph.folders)} libraries, {checked} includes checked, "
              f"{len(violations)} violation(s), {len(cycles)} cycle(s)")
        return 1
    print(f"layering: {len(graph.folders)} libraries, {checked} includes checked, no violations")
    return 0


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Check that includes follow the library layering.")
    parser.add_argument("--root", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent.parent,
                        help="repository root (default: the parent of scripts/)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dot", action="store_true", help="print the dependency graph as Graphviz dot")
    mode.add_argument("--markdown", action="store_true", help="print the dependency graph as a Markdown list")
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    root = args.root.resolve()
    src = root / "src"
    if not src.is_dir():
        print(f"check_layers: {src} is not a folder", file=sys.stderr)
        return 2
    graph = build_graph(src)
    if args.dot:
        print_dot(graph)
        return 0
    if args.markdown:
        print_markdown(graph)
        return 0
    return run_check(root, src, graph)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
