#!/usr/bin/env python3
"""The crate's module import graph, read from the source: which module names which.

Usage: scripts/import_graph.py [--dot] [--depth N] [--src DIR]

A module is a file under src/ (`a/b.rs` and `a/b/mod.rs` are `a::b`), cut to its first N path
segments (default 2: `cluster::snapshot`, `extender::probes`). An edge A -> B is a `crate::B...`
path (or a `super::` / `self::` path that resolves to B) anywhere in A's non-test code (`use`
lines and inline paths; a `#[cfg(test)]` module at the end of a file is left out: tests may
reach anywhere; comments, doc links included, are not imports). A parent naming its child
counts; a child naming its parent does not. Prints the edges, the cycles (strongly
connected components of more than one module, and their edges) and the arrows that point up
the layer order below; exits 1 when there is a cycle, an upward arrow, or a top-level module
the layer table does not place.
"""
import functools
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
if "--src" in sys.argv:
    SRC = sys.argv[sys.argv.index("--src") + 1]
# Lower layers first: a module may name only modules of its own layer or below.
LAYERS = [
    ["clock", "api_calls"],
    ["model"],
    ["placement"],
    ["cluster"],
    ["metrics"],
    ["sync"],
    ["leader"],
    ["scheduler"],
    ["extender"],
    ["ops"],
    ["cli", "app"],
    ["main", "lib"],
]


def layer_of(module):
    top = module.split("::")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return None


def module_of(path, depth):
    rel = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    return "::".join(rel[:depth]) if rel else "lib"


def strip_comments(text):
    """Drops `//` comments (doc links are not imports); string literals are rare enough here."""
    return re.sub(r"//[^\n]*", "", text)


def strip_tests(text):
    # Cut at a `#[cfg(test)]` that introduces a module (inline test modules sit at the end).
    m = re.search(r"^\s*#\[cfg\(test\)\]\s*\n\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text, re.M)
    text = text[: m.start()] if m else text
    # `#[cfg(test)] mod x;` declarations are not edges either.
    return re.sub(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*;", "", text)


@functools.lru_cache(maxsize=None)
def test_modules(path):
    """The modules `path` declares under `#[cfg(test)]` as their own files (`mod tests;`)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return tuple(re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z: ]+\))?\s+)?mod\s+(\w+)\s*;", text))


def test_only(path, files):
    """Whether `path` is (under) a test module another file declares with `#[cfg(test)]`:
    tests may reach anywhere, as inline test modules do."""
    full = module_of(path, 99)
    for f in files:
        parent = module_of(f, 99)
        for name in test_modules(f):
            child = name if parent == "lib" else parent + "::" + name
            if full == child or full.startswith(child + "::"):
                return True
    return False


def absolute(text, module, is_mod_file):
    """Rewrites `super::` and `self::` paths as `crate::` paths of `module`."""
    parts = [] if module == "lib" else module.split("::")
    # In `a/b.rs` (module a::b) `super` is `a`; in `a/b/mod.rs` too, and `self` is a::b.
    def repl(m):
        ups = m.group(0).count("super::")
        base = parts[: len(parts) - ups] if ups else parts
        return "crate::" + "".join(p + "::" for p in base)
    return re.sub(r"\b(?:self::|(?:super::)+)", repl, text)


def uses(text, depth):
    out = set()
    # Expand `use crate::{a::b, c}` groups one level.
    for m in re.finditer(r"crate::\{([^}]*)\}", text):
        for part in m.group(1).split(","):
            segs = [s for s in re.split(r"::", part.strip()) if s]
            segs = [s for s in segs if re.match(r"^[a-z_][a-z0-9_]*$", s)]
            if segs:
                out.add("::".join(segs[:depth]))
    for m in re.finditer(r"crate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
        segs = m.group(1).split("::")
        out.add("::".join(segs[:depth]))
    return out


def main():
    depth = 2
    if "--depth" in sys.argv:
        depth = int(sys.argv[sys.argv.index("--depth") + 1])
    files = []
    for root, _, names in os.walk(SRC):
        files += [os.path.join(root, n) for n in names if n.endswith(".rs")]
    files = [f for f in files if not test_only(f, files)]
    modules = {module_of(f, depth) for f in files}
    modules_full = {module_of(f, 99) for f in files}
    edges = set()
    for f in files:
        a = module_of(f, depth)
        full = module_of(f, 99)
        with open(f, encoding="utf-8") as fh:
            text = absolute(strip_comments(strip_tests(fh.read())), full, f.endswith("mod.rs"))
        found = uses(text, depth)
        # A child module named bare (`probes::healthz` in extender/mod.rs).
        for child in {m for m in modules_full if m.startswith(full + "::")}:
            name = child[len(full) + 2 :].split("::")[0]
            if re.search(r"(?<![:\w])" + name + r"::", text):
                found.add("::".join((full + "::" + name).split("::")[:depth]))
        for b in found:
            # A path may go deeper than a module file: cut to a known module prefix.
            while b and b not in modules:
                b = "::".join(b.split("::")[:-1])
            # A parent naming its child is how a facade works (kept); a child naming its
            # parent's items is not counted (it would make every facade a cycle).
            if b and b != a and not a.startswith(b + "::"):
                edges.add((a, b))
    # Tarjan's strongly connected components.
    graph = {m: sorted(b for (a, b) in edges if a == m) for m in modules}
    index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for m in sorted(modules):
        if m not in index:
            visit(m)
    upward = sorted(
        (a, b)
        for (a, b) in edges
        if layer_of(a) is not None and layer_of(b) is not None and layer_of(b) > layer_of(a)
    )
    if "--dot" in sys.argv:
        print("digraph imports {")
        for a, b in sorted(edges):
            print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    print(f"modules: {len(modules)}, edges: {len(edges)}")
    print(f"cycles: {len(sccs)}")
    for comp in sccs:
        inside = sorted((a, b) for (a, b) in edges if a in comp and b in comp)
        print("  " + " , ".join(comp))
        for a, b in inside:
            print(f"    {a} -> {b}")
    print(f"upward arrows: {len(upward)}")
    for a, b in upward:
        print(f"  {a} -> {b}")
    unplaced = sorted({m.split("::")[0] for m in modules if layer_of(m) is None})
    print(f"modules without a layer: {len(unplaced)}")
    for m in unplaced:
        print(f"  {m}")
    return 1 if sccs or upward or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
