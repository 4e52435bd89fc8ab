#!/usr/bin/env python3
"""Finds import circles among the files of each folder of the given crates.

Every folder of a crate's src/ is looked at on its own: its nodes are its
files (mod.rs, lib.rs and main.rs are the folder's face, not nodes) and its
subfolders (a subfolder with everything under it is one node). File A of the
folder depends on node B when product code anywhere under A names a path
under B: `use` trees, `crate::`/`super::`/`self::` paths in code, and a child
module's name from the folder's face. Test modules (`#[cfg(test)]` to the end
of a file) do not count, nor do `$crate::` paths in a macro's body (they
resolve where the macro expands). Prints each circle (a strongly connected set of two
or more nodes) with one edge that closes it, and exits 1 if there is one.

    python3 scripts/module_circles.py interposer nodemgr layout
    python3 scripts/module_circles.py --counts interposer   # lines per folder too
    python3 scripts/module_circles.py --layers interposer   # files top to bottom
"""

import argparse
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    """Removes comments and string/char literal contents (keeps line breaks)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12]):
            i = text.find("'", i + 2) + 1
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def product_code(text):
    code = strip_comments_and_strings(text)
    m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+" + IDENT, code)
    return code[: m.start()] if m else code


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> [[a,b],[a,c,d],[a,c,e]] (renames and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)
    paths = []

    def walk(prefix, s):
        depth, parts, cur = 0, [], ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        for part in parts:
            brace = part.find("{")
            if brace >= 0 and part.endswith("}"):
                head = [p for p in part[:brace].split("::") if p]
                walk(prefix + head, part[brace + 1:-1])
            else:
                segs = [seg for seg in part.split("::") if seg and seg != "*"]
                if segs and segs[-1] == "self":
                    segs = segs[:-1]
                paths.append(prefix + segs)

    walk([], tree)
    return paths


class Crate:
    def __init__(self, root):
        self.src = os.path.join(root, "src")
        self.files = {}  # module path tuple -> (file path, product code)
        for dirpath, _, names in os.walk(self.src):
            for name in sorted(names):
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, self.src)[:-3].split(os.sep)
                if rel[0] == "bin":
                    continue  # binaries are crates of their own
                if rel[-1] in ("mod", "lib", "main"):
                    rel = rel[:-1]
                with open(path, encoding="utf-8") as f:
                    self.files[tuple(rel)] = (path, product_code(f.read()))

    def is_face(self, module):
        path = self.files[module][0]
        return os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")

    def children_of(self, module):
        """Module paths one level below `module` (files and folders)."""
        n = len(module)
        return {k[: n + 1] for k in self.files if len(k) > n and tuple(k[:n]) == tuple(module)}

    def references(self, module):
        """Absolute module paths (tuples) this module's product code names."""
        path, code = self.files[module]
        here = list(module)
        found = []
        # `use` trees, with rename and `pub` prefixes stripped.
        for m in re.finditer(r"\buse\s+([^;]+);", code):
            tree = re.sub(r"\s+as\s+" + IDENT, "", m.group(1))
            for p in expand_use_tree(tree):
                found.append(p)
        # Paths in code.
        for m in re.finditer(r"(?<![A-Za-z0-9_:$])((?:crate|super|self)(?:::" + IDENT + r")+)", code):
            found.append(m.group(1).split("::"))
        # A face's children named directly (`sampler::start()` in mod.rs).
        if self.is_face(module):
            children = {k[len(here)] for k in self.children_of(here)}
            for m in re.finditer(r"(?<![A-Za-z0-9_:])(" + IDENT + r")::", code):
                if m.group(1) in children:
                    found.append(["self", m.group(1)])
        resolved = []
        for p in found:
            if p[0] == "crate":
                absolute = p[1:]
            elif p[0] == "self":
                absolute = here + p[1:]
            elif p[0] == "super":
                # A face (mod.rs) is its folder's module; a file's `super` is
                # that folder.
                absolute, rest = here[:], p
                while rest and rest[0] == "super":
                    absolute, rest = absolute[:-1], rest[1:]
                absolute += rest
            elif self.is_face(module) and (tuple(here) + (p[0],)) in self.children_of(here):
                absolute = here + p  # `use child::Item;` in mod.rs
            else:
                continue  # an extern crate or a name in scope
            resolved.append(tuple(absolute))
        return resolved


def face_name(crate, folder):
    return os.path.basename(crate.files[folder][0])


def folder_graphs(crate):
    """folder module path -> {node: set(node)}"""
    folders = {}
    for module in crate.files:
        if crate.is_face(module):
            folders.setdefault(module, {})
    for module in crate.files:
        refs = crate.references(module)
        for folder in folders:
            depth = len(folder)
            if tuple(module[:depth]) != folder:
                continue
            # The folder's face is a node of its own: items it defines
            # (lib.rs's helpers, say) can close a circle with its files.
            node = module[depth] if len(module) > depth else face_name(crate, folder)
            graph = folders[folder]
            graph.setdefault(node, set())
            for target in refs:
                if len(target) < depth or tuple(target[:depth]) != folder:
                    continue
                if len(target) == depth:
                    continue  # the folder's module itself (`use crate::sm_time;`)
                child = target[depth]
                if any(k[: depth + 1] == folder + (child,) for k in crate.files):
                    other = child
                else:
                    other = face_name(crate, folder)  # an item the face defines
                if other != node:
                    graph[node].add(other)
    return folders


def circles(graph):
    """Strongly connected components with two or more nodes (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layers(graph):
    """Nodes grouped by the longest path below them, top layer first."""
    height = {}

    def below(v):
        if v not in height:
            height[v] = 1 + max((below(w) for w in graph.get(v, ())), default=-1)
        return height[v]

    grouped = {}
    for v in graph:
        grouped.setdefault(below(v), []).append(v)
    return [sorted(grouped[h]) for h in sorted(grouped, reverse=True)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("crates", nargs="+", help="crate folders (each with src/)")
    parser.add_argument("--counts", action="store_true", help="also print files and lines per folder")
    parser.add_argument(
        "--layers",
        action="store_true",
        help="also print each folder's nodes in layers, top first (a node uses only layers below it)",
    )
    args = parser.parse_args()
    status = 0
    for root in args.crates:
        crate = Crate(root)
        graphs = folder_graphs(crate)
        for folder in sorted(graphs):
            name = os.path.join(root, "src", *folder)
            for comp in circles(graphs[folder]):
                status = 1
                members = set(comp)
                edges = sorted(
                    f"{a} -> {b}" for a in comp for b in graphs[folder][a] if b in members
                )
                print(f"{name}: circle of {len(comp)}: {', '.join(comp)}")
                for e in edges:
                    print(f"    {e}")
            if args.layers and not circles(graphs[folder]):
                print(f"{name}: {' | '.join(', '.join(layer) for layer in layers(graphs[folder]))}")
            if args.counts:
                paths = [crate.files[m][0] for m in crate.files if m[: len(folder)] == folder]
                lines = sum(sum(1 for _ in open(p, encoding="utf-8")) for p in paths)
                print(f"{name}: {len(paths)} files, {lines} lines")
    if status == 0:
        print(f"module circles: none among the files of any folder of {', '.join(args.crates)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
