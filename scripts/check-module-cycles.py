#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a circle.

For every crate of the workspace (cobalt-proto, cobalt, cobalt-cli, ...) it maps each
source file to its module, reads the paths the file uses (`use` declarations and
`crate::`/`super::`/`self::` paths in code; test modules are left out), resolves each
path to the file that defines the item — following `pub use` re-exports — and draws an
edge from the file to that file. A strongly connected set of more than one file is a
cycle: some module imports, directly or through others, a module that imports it.

Known cycles that are being taken apart may be listed in
scripts/module-cycles.allow, one per line as the sorted files separated by spaces;
a cycle that is not inside a listed one fails the check.

Usage: scripts/check-module-cycles.py [--list] [CRATE_DIR ...]
  --list   print every cycle and its edges, and exit 0
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOW = os.path.join(ROOT, "scripts", "module-cycles.allow")


def strip_comments_and_strings(src):
    """Removes comments, string and char literals (keeps line structure)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append("\n" if src[i] == "\n" else "")
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", src[i:i + 12]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", src[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


TEST_ATTR = re.compile(r"#\[cfg\((?:test|all\(test[^)]*\)|any\(test[^)]*\))\)\]")


def drop_inline_test_modules(src):
    """Removes `#[cfg(test)] mod name { ... }` blocks."""
    while True:
        m = re.search(TEST_ATTR.pattern + r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", src)
        if not m:
            return src
        depth, j = 1, m.end()
        while j < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        src = src[:m.start()] + src[j:]


class Crate:
    def __init__(self, path):
        self.path = path
        src = os.path.join(path, "src")
        self.root = next(
            (os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.isfile(os.path.join(src, f))),
            None,
        )
        self.files = {}  # module path (tuple) -> file
        self.text = {}  # file -> cleaned source
        if self.root:
            self.load((), self.root)

    def child_file(self, parent_file, parent_mod, name):
        base = os.path.dirname(parent_file)
        if os.path.basename(parent_file) not in ("lib.rs", "main.rs", "mod.rs"):
            base = os.path.join(base, os.path.splitext(os.path.basename(parent_file))[0])
        for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
            if os.path.isfile(cand):
                return cand
        return None

    def load(self, mod, file):
        with open(file, encoding="utf-8") as f:
            raw = f.read()
        text = drop_inline_test_modules(strip_comments_and_strings(raw))
        self.files[mod] = file
        self.text[file] = text
        for m in re.finditer(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
            attrs, name = m.group(1), m.group(2)
            if TEST_ATTR.search(attrs) or name == "tests" or name.endswith("_tests"):
                continue
            path_attr = re.search(r'#\[path\s*=\s*""\]', attrs)
            child = None if path_attr else self.child_file(file, mod, name)
            if child:
                self.load(mod + (name,), child)

    def module_of(self, file):
        return next(m for m, f in self.files.items() if f == file)


# `use` declarations that are not re-exports (a `pub use` is a facade, not a dependency).
USE = re.compile(r"(?<![\w)])\s*(?<!pub )(?<!\) )\buse\s+([^;]+);")
REEXPORT = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s+[^;]+;")
PATH = re.compile(r"\b((?:crate|super|self)(?:\s*::\s*\w+)+)")


def expand_use(tree):
    """Expands a use tree `a::{b, c::{d, e}}` into paths (lists of segments)."""
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        if "{" in s and s.endswith("}"):
            head, inner = s.split("{", 1)
            head = [h for h in head.split("::") if h]
            for part in split_top(inner[:-1]):
                yield from go(prefix + head, part)
        else:
            seg = [x for x in s.split("::") if x]
            seg = seg[:-1] + [seg[-1].split("as")[0]] if seg and "as" in seg[-1] and seg[-1] != "as" else seg
            if seg and seg[-1] in ("self", "*"):
                seg = seg[:-1]
            yield prefix + seg

    yield from go([], tree)


def resolve(crate, mod, segs, reexports, depth=0):
    """The module (tuple) that defines what `segs` names, seen from `mod`."""
    if depth > 20 or not segs:
        return None
    head, rest = segs[0], segs[1:]
    if head == "crate":
        base = ()
    elif head == "super":
        base = mod[:-1]
    elif head == "self":
        base = mod
    else:
        base = mod
        rest = segs
    while rest and rest[0] == "super":
        base, rest = base[:-1], rest[1:]
    cur = base
    for i, s in enumerate(rest):
        if cur + (s,) in crate.files:
            cur = cur + (s,)
            continue
        target = reexports.get((cur, s))
        if target is not None:
            return resolve(crate, target[0], target[1] + rest[i + 1:], reexports, depth + 1) or target[0]
        return cur
    return cur


def reexport_map(crate):
    """(module, name) -> (module of the `pub use`, its path) for every re-export."""
    out = {}
    for mod, file in crate.files.items():
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", crate.text[file]):
            for segs in expand_use(m.group(1)):
                if segs:
                    out[(mod, segs[-1])] = (mod, segs)
    return out


def edges_of(crate):
    reexports = reexport_map(crate)
    edges = defaultdict(set)
    names = defaultdict(set)
    for mod, file in crate.files.items():
        text = REEXPORT.sub("", crate.text[file])
        paths = []
        for m in USE.finditer(text):
            paths.extend(expand_use(m.group(1)))
        for m in PATH.finditer(text):
            paths.append([p.strip() for p in m.group(1).split("::")])
        for segs in paths:
            if not segs or segs[0] not in ("crate", "super", "self") and (mod + (segs[0],)) not in crate.files:
                continue
            target = resolve(crate, mod, segs, reexports)
            if target is None or target == mod:
                continue
            if mod[: len(target)] == target and len(target) < len(mod) and not defines(crate, target, segs[-1]):
                continue  # a parent only re-exports or declares: not an edge
            tf = crate.files[target]
            if tf != file:
                edges[file].add(tf)
                names[(file, tf)].add(segs[-1])
    return edges, names


def defines(crate, mod, name):
    text = crate.text[crate.files[mod]]
    return re.search(
        r"\b(?:fn|struct|enum|trait|type|const|static|macro_rules!)\s+" + re.escape(name) + r"\b", text
    ) is not None


def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            strong(v)
    return [c for c in out if len(c) > 1]


def main(argv):
    listing = "--list" in argv
    dirs = [a for a in argv if not a.startswith("--")] or sorted(
        os.path.join(ROOT, d)
        for d in os.listdir(ROOT)
        if os.path.isfile(os.path.join(ROOT, d, "Cargo.toml")) and os.path.isdir(os.path.join(ROOT, d, "src"))
    )
    allowed = []
    if os.path.isfile(ALLOW):
        with open(ALLOW) as f:
            allowed = [set(l.split()) for l in f if l.strip() and not l.startswith("#")]
    failed = False
    for d in dirs:
        crate = Crate(d)
        if not crate.root:
            continue
        edges, names = edges_of(crate)
        for comp in sccs(list(crate.files.values()), edges):
            rel = [os.path.relpath(f, ROOT) for f in comp]
            known = any(set(rel) <= a for a in allowed)
            if not known:
                failed = True
            if listing or not known:
                print(("known " if known else "NEW ") + f"cycle of {len(rel)} files in {os.path.relpath(d, ROOT)}:")
                for f in comp:
                    for t in sorted(edges[f] & set(comp)):
                        print(f"  {os.path.relpath(f, ROOT)} -> {os.path.relpath(t, ROOT)}: "
                              + ", ".join(sorted(names[(f, t)])[:6]))
                if not known:
                    print("  allowed as: " + " ".join(sorted(rel)))
    if failed and not listing:
        print("\nmodule cycles found: make the imports point one way (a shared type moves down "
              "into a leaf module), or, for a cycle being taken apart, list it in "
              "scripts/module-cycles.allow", file=sys.stderr)
        return 1
    if not failed:
        print("no new module cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
