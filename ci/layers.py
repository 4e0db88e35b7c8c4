#!/usr/bin/env python3
"""The layering check of both crates (run by ci/tests/05-layers.sh; `--self-test` checks it).

Rules, each finding printed as `path:line: [rule] message`:

  a  softroce/src/{driver,proto,wire}/ never reach `verbs` (the C-ABI layer on top).
  b  src/transport/proto/ (the sans-IO core) uses no crate::ibv, std::net, std::time::Instant,
     libc, and no crate module but crate::error and crate::transport::proto itself.
  c  No import cycle between the files of a crate.
  d  A module-level `const`/`static` name is defined in one file of a crate only; values of
     `enum ibv_wc_status` are never re-declared (they come from rdma-sys).
  e  No non-test function is longer than 100 lines (`fn` to its closing brace).
  f  Every `unsafe fn` has a `# Safety` section in its doc comment.

The file graph (rule c): a file depends on another when it names it in a private `use` or in a
path expression (`crate::x::y`, `super::y`, `self::y`, a child module `y::z`, or a module
alias a `use` bound). A path resolves to the deepest module file it names (`src/x.rs` or
`src/x/mod.rs`); an item a module only re-exports (`pub use a::Item`) resolves to where it is
defined, and a re-export itself is no edge, so a facade `mod.rs` does not tie its children
into a cycle. Macro invocations are no edges. Test code (`#[cfg(test)]` items and modules,
`#[test]` functions, files behind `#[cfg(test)] mod x;`) and `tests/` folders are not read.
"""

import os
import re
import sys
import tempfile

MAX_FN_LINES = 100

# `enum ibv_wc_status` (rdma-sys), without the IBV_WC_ prefix; SUCCESS is left out (too
# common a name: NCCL's ncclSuccess is another SUCCESS).
WC_STATUS_NAMES = {
    "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
    "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",
    "REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",
    "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR",
    "RESP_TIMEOUT_ERR", "GENERAL_ERR", "TM_ERR", "TM_RNDV_INCOMPLETE",
}

# Names allowed in more than one file of a crate (rule d): (crate, name) -> (the folder every
# definition must lie in, the reason). Field offsets inside a `mod field` (the byte layout of
# one header, smoltcp style) are not module-level constants of the crate and are not listed.
DUPLICATE_ALLOWED = {
    ("softroce", "HEADER_LEN"): (
        "wire" + os.sep,
        "each wire header module states its own length (bth::HEADER_LEN, reth::HEADER_LEN, ...)",
    ),
}


# ------------------------------------------------------------------------------------------
# Lexing: blank comments and literal contents, keep every newline (so offsets map to lines).
# ------------------------------------------------------------------------------------------

def strip(text):
    out = list(text)
    n = len(text)
    i = 0

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    def ident_before(k):
        return k > 0 and (text[k - 1].isalnum() or text[k - 1] == "_")

    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c in "rb" and not ident_before(i) and re.match(r'(br|r)#*"', text[i:i + 80]):
            m = re.match(r'(br|r)(#*)"', text[i:])
            close = '"' + m.group(2)
            start = i + len(m.group(0))
            j = text.find(close, start)
            j = n if j < 0 else j
            blank(start, j)
            i = j + len(close)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 3)  # past the escaped character (it may be a quote)
                j = n if j < 0 else j
                blank(i + 1, j)
                i = j + 1
            elif i + 2 < n and text[i + 2] == "'":
                blank(i + 1, i + 2)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


# ------------------------------------------------------------------------------------------
# One source file: items, blocks, test regions, uses, paths.
# ------------------------------------------------------------------------------------------

CFG_TEST = re.compile(r"#\s*\[\s*(cfg\s*\(\s*test\s*\)|test)\s*\]")
INNER_CFG_TEST = re.compile(r"#!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
FN_HEAD = re.compile(r"\bfn\s+([A-Za-z_]\w*)")
MOD_HEAD = re.compile(r"\bmod\s+([A-Za-z_]\w*)\s*$")
IMPL_HEAD = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(unsafe\s+)?(impl|trait)\b")
ATTRS = r"(\s*#!?\s*\[[^\]]*\])*"
USE_HEAD = re.compile(ATTRS + r"\s*(pub(\s*\([^)]*\))?\s+)?use\s")  # used with match(pos)
CONST_HEAD = re.compile(r"^" + ATTRS + r"\s*(pub(\s*\([^)]*\))?\s+)?(const|static)\s+(mut\s+)?([A-Za-z_]\w*)\s*:")
MOD_DECL = re.compile(r"^" + ATTRS + r"\s*(pub(\s*\([^)]*\))?\s+)?mod\s+([A-Za-z_]\w*)\s*$")
UNSAFE_FN = re.compile(r'\bunsafe\s+(extern\s+"[^"]*"\s+)?fn\s+([A-Za-z_]\w*)')


class Frame:
    def __init__(self, kind, name, test, start):
        self.kind, self.name, self.test, self.start = kind, name, test, start
        self.paren = 0


class Source:
    """What the checker needs of one file: blocks, `use` statements, `mod` declarations,
    module-level consts, functions, and the test regions to ignore."""

    def __init__(self, path, text):
        self.path = path
        self.text = text
        self.code = strip(text).replace("$crate", " crate")
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", self.code)]
        self.test_spans = []  # (start, end) of test-only code
        self.inline_mods = []  # (start, end, [names]) of inline `mod x { }`
        self.uses = []  # (offset, text, is_pub, inline module names)
        self.mod_decls = []  # (name, is_test)
        self.consts = []  # (name, offset)
        self.fns = []  # (name, start offset, end offset)
        self.whole_file_test = bool(INNER_CFG_TEST.search(self.code))
        self._scan()

    def line(self, off):
        lo, hi = 0, len(self.line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.line_starts[mid] <= off:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    def in_test(self, off):
        return self.whole_file_test or any(a <= off < b for a, b in self.test_spans)

    def inline_path(self, off):
        best = []
        for a, b, names in self.inline_mods:
            if a <= off < b and len(names) > len(best):
                best = names
        return best

    def _scan(self):
        code = self.code
        n = len(code)
        stack = [Frame("file", None, False, 0)]
        seg = 0  # start of the current statement / header
        i = 0
        while i < n:
            c = code[i]
            if c in " \t\r\n" and seg == i:
                seg = i + 1
                i += 1
                continue
            if seg == i and USE_HEAD.match(code, i, min(n, i + 400)):
                j = code.find(";", i)
                j = n if j < 0 else j
                head = code[i:j]
                test = stack[-1].test or bool(CFG_TEST.search(head))
                if test:
                    self.test_spans.append((i, j + 1))
                else:
                    is_pub = bool(re.match(ATTRS + r"\s*pub\b", head))
                    self.uses.append((i, head, is_pub, self._mods(stack)))
                i = seg = j + 1
                continue
            top = stack[-1]
            if c in "([":
                top.paren += 1
            elif c in ")]":
                top.paren = max(0, top.paren - 1)
            elif c == ";" and top.paren == 0:
                self._statement(code[seg:i], seg, stack, block=False)
                seg = i + 1
            elif c == "{":
                head = code[seg:i]
                self._statement(head, seg, stack, block=True)
                test = top.test or bool(CFG_TEST.search(head))
                m_fn = FN_HEAD.search(head)
                m_mod = MOD_HEAD.search(head)
                if m_fn:
                    f = Frame("fn", m_fn.group(1), test, seg + m_fn.start())
                elif m_mod:
                    f = Frame("mod", m_mod.group(1), test, i)
                elif IMPL_HEAD.match(head):
                    f = Frame("impl", None, test, i)
                else:
                    f = Frame("block", None, test, i)
                stack.append(f)
                seg = i + 1
            elif c == "}":
                if len(stack) > 1:
                    f = stack.pop()
                    if f.test and not stack[-1].test:
                        self.test_spans.append((f.start, i + 1))
                    if f.kind == "mod":
                        self.inline_mods.append((f.start, i + 1, self._mods(stack) + [f.name]))
                    if f.kind == "fn" and not f.test:
                        self.fns.append((f.name, f.start, i))
                seg = i + 1
            i += 1

    @staticmethod
    def _mods(stack):
        return [f.name for f in stack if f.kind == "mod"]

    def _statement(self, head, off, stack, block):
        test = stack[-1].test or bool(CFG_TEST.search(head))
        module_level = all(f.kind in ("file", "mod") for f in stack)
        if not module_level:
            return
        m = CONST_HEAD.match(head)
        in_field = any(f.kind == "mod" and f.name == "field" for f in stack)
        if m and m.group(6) != "_" and not test and not in_field:
            self.consts.append((m.group(6), off + m.start(6)))
        if not block:
            m = MOD_DECL.match(head)
            if m and not self._mods(stack):
                self.mod_decls.append((m.group(4), test))
        if test and not block:
            self.test_spans.append((off, off + len(head) + 1))


# ------------------------------------------------------------------------------------------
# Use trees and paths.
# ------------------------------------------------------------------------------------------

def split_top(s, sep=","):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def expand_use(tree, prefix=()):
    """`a::{b, c::{self, d as e}}` -> [(path, bound name)]; bound name '*' for a glob."""
    tree = re.sub(r"\s+", " ", tree).strip()
    out = []
    m = re.match(r"^(.*?)\{(.*)\}$", tree, re.S)
    if m:
        head = [p.strip() for p in m.group(1).split("::") if p.strip()]
        for part in split_top(m.group(2)):
            out += expand_use(part, prefix + tuple(head))
        return out
    alias = None
    am = re.match(r"^(.*)\s+as\s+(\w+)$", tree)
    if am:
        tree, alias = am.group(1), am.group(2)
    segs = [p.strip() for p in tree.split("::") if p.strip()]
    if segs and segs[-1] == "self":
        segs = segs[:-1]
    path = prefix + tuple(segs)
    if not path:
        return out
    out.append((path, alias or path[-1]))
    return out


PATH_RE = re.compile(r"(?<![\w:])((?:[A-Za-z_]\w*)(?:\s*::\s*[A-Za-z_*]\w*)+)(\s*!)?")


class Crate:
    def __init__(self, name, root, display_root):
        self.name = name
        self.root = root  # folder holding lib.rs
        self.display_root = display_root  # path prefix printed in findings
        self.files = {}  # module path tuple -> rel path
        self.sources = {}  # rel path -> Source
        self.inline = {}  # module path tuple -> rel path (inline modules)
        self.reexports = {}  # module path tuple -> {name: abs path tuple}
        self.aliases = {}  # (rel path, inline mods tuple) -> {name: abs module path}
        self.refs = []  # (rel path, offset, abs path tuple, is_pub_use)
        self._load()

    def shown(self, rel):
        return os.path.join(self.display_root, rel)

    def _load(self):
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            for f in sorted(filenames):
                if not f.endswith(".rs"):
                    continue
                full = os.path.join(dirpath, f)
                rel = os.path.relpath(full, self.root)
                parts = rel[:-3].split(os.sep)
                if parts[-1] in ("mod", "lib", "main"):
                    parts = parts[:-1]
                if rel in ("main.rs",) and "lib.rs" in os.listdir(self.root):
                    continue
                with open(full, encoding="utf-8", errors="replace") as fh:
                    self.sources[rel] = Source(rel, fh.read())
                self.files[tuple(parts)] = rel
        # Files behind `#[cfg(test)] mod x;` are test code.
        self.test_files = set()
        for mod, rel in sorted(self.files.items(), key=lambda kv: len(kv[0])):
            parent = self.files.get(mod[:-1]) if mod else None
            if parent is None:
                continue
            if parent in self.test_files:
                self.test_files.add(rel)
                continue
            for name, test in self.sources[parent].mod_decls:
                if name == mod[-1] and test:
                    self.test_files.add(rel)
        for rel, src in self.sources.items():
            if src.whole_file_test:
                self.test_files.add(rel)
        for rel, src in self.sources.items():
            base = self.module_of(rel)
            for a, b, names in src.inline_mods:
                self.inline[base + tuple(names)] = rel
        self._collect_uses()
        self._collect_paths()

    def module_of(self, rel):
        for mod, r in self.files.items():
            if r == rel:
                return mod
        return ()

    def is_module(self, path):
        return path in self.files or path in self.inline

    def live_sources(self):
        return [(rel, s) for rel, s in sorted(self.sources.items()) if rel not in self.test_files]

    def absolute(self, rel, inline, segs, aliases=True):
        """Crate-absolute module path of `segs` written in `rel` (inside inline modules
        `inline`), or None when it names something outside the crate."""
        ctx = self.module_of(rel) + tuple(inline)
        head = segs[0]
        if head == "crate":
            return tuple(segs[1:])
        if head == "self":
            return ctx + tuple(segs[1:])
        if head == "super":
            k = 0
            while k < len(segs) and segs[k] == "super":
                k += 1
            return ctx[: max(0, len(ctx) - k)] + tuple(segs[k:])
        if self.is_module(ctx + (head,)):
            return ctx + tuple(segs)
        if aliases:
            table = self.aliases.get((rel, tuple(inline)), {})
            if head in table:
                return table[head] + tuple(segs[1:])
        return None

    def resolve(self, path, depth=0):
        """(file, module path) that `path` names, following re-exports."""
        cur = ()
        k = 0
        while k < len(path) and self.is_module(cur + (path[k],)):
            cur = cur + (path[k],)
            k += 1
        rest = path[k:]
        if rest and rest[0] != "*" and depth < 16:
            target = self.reexports.get(cur, {}).get(rest[0])
            if target is not None:
                if target == "extern":
                    return None, None
                return self.resolve(target + tuple(rest[1:]), depth + 1)
        rel = self.files.get(cur) or self.inline.get(cur)
        return rel, cur

    def _collect_uses(self):
        pending = []
        for rel, src in self.live_sources():
            for off, text, is_pub, inline in src.uses:
                body = re.sub(r"^" + ATTRS + r"\s*(pub(\s*\([^)]*\))?\s+)?use\s", "", text)
                for segs, bound in expand_use(body):
                    pending.append((rel, off, tuple(inline), segs, bound, is_pub))
        # Re-exports and aliases first (a use may name a module another use re-exports).
        for rel, off, inline, segs, bound, is_pub in pending:
            absp = self.absolute(rel, inline, segs, aliases=False)
            modp = self.module_of(rel) + inline
            if is_pub and bound != "*":
                self.reexports.setdefault(modp, {})[bound] = absp if absp is not None else "extern"
        for rel, off, inline, segs, bound, is_pub in pending:
            absp = self.absolute(rel, inline, segs, aliases=False)
            if absp is None or bound == "*":
                continue
            f, cur = self.resolve(absp)
            if f is not None and cur == absp:
                self.aliases.setdefault((rel, inline), {})[bound] = absp
        for rel, off, inline, segs, bound, is_pub in pending:
            absp = self.absolute(rel, inline, segs)
            self.refs.append((rel, off, absp, segs, is_pub, bound))

    def _collect_paths(self):
        for rel, src in self.live_sources():
            use_spans = [(off, off + len(text)) for off, text, _, _ in src.uses]
            for m in PATH_RE.finditer(src.code):
                off = m.start()
                if m.group(2) or src.in_test(off) or any(a <= off < b for a, b in use_spans):
                    continue
                segs = tuple(re.sub(r"\s+", "", m.group(1)).split("::"))
                absp = self.absolute(rel, src.inline_path(off), segs)
                self.refs.append((rel, off, absp, segs, False, None))

    def edges(self):
        """{file: {file: first offset}} of dependencies (re-exports excluded)."""
        out = {}
        for rel, off, absp, segs, is_pub, bound in self.refs:
            if absp is None or (is_pub and bound is not None):
                continue
            f, cur = self.resolve(absp)
            if f is None or f == rel or f in self.test_files:
                continue
            if bound not in (None, "*") and cur == absp:
                continue  # a `use` of a module only binds a name; its uses are the edges
            out.setdefault(rel, {}).setdefault(f, off)
        return out


# ------------------------------------------------------------------------------------------
# Rules
# ------------------------------------------------------------------------------------------

def finding(out, crate, rel, off, rule, msg):
    src = crate.sources[rel]
    out.append((crate.shown(rel), src.line(off), rule, msg))


def rule_forbidden_imports(crate, out):
    for rel, off, absp, segs, is_pub, bound in crate.refs:
        parts = rel.split(os.sep)
        shown = "::".join(segs)
        if crate.name == "softroce" and parts[0] in ("driver", "proto", "wire"):
            if absp is not None and absp[:1] == ("verbs",):
                finding(out, crate, rel, off, "a",
                        f"{parts[0]}/ imports the verbs layer ({shown}); verbs sits on top and only calls down")
        if crate.name == "ferroce" and parts[:2] == ["transport", "proto"]:
            why = None
            if segs[0] == "libc":
                why = "libc"
            elif segs[:2] == ("std", "net") or segs[:2] == ("core", "net"):
                why = "std::net (sockets)"
            elif segs[:3] == ("std", "time", "Instant") or (segs[:2] == ("std", "time") and "Instant" in segs):
                why = "std::time::Instant (a clock read; time is an argument)"
            elif absp is not None and absp:
                if absp[:1] == ("ibv",):
                    why = "crate::ibv (verbs)"
                elif absp[:2] == ("transport", "proto") or absp[:1] == ("error",):
                    why = None
                elif absp[:1] == ("transport",):
                    why = f"crate::transport::{absp[1] if len(absp) > 1 else ''} (the I/O layer around the core)"
                else:
                    why = f"crate::{absp[0]} (proto may use crate::error only)"
            if why:
                finding(out, crate, rel, off, "b", f"the sans-IO core imports {why}: {shown}")


def rule_cycles(crate, out):
    graph = crate.edges()
    index, low, on, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, {})):
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
    for v in sorted(set(graph) | {w for e in graph.values() for w in e}):
        if v not in index:
            visit(v)
    for comp in sccs:
        members = set(comp)
        # A shortest loop through the first file, for the message.
        start = comp[0]
        prev = {start: None}
        queue = [start]
        loop = None
        while queue and loop is None:
            v = queue.pop(0)
            for w in sorted(graph.get(v, {})):
                if w not in members:
                    continue
                if w == start:
                    loop = v
                    break
                if w not in prev:
                    prev[w] = v
                    queue.append(w)
        chain = [start]
        v = loop
        while v is not None and v != start:
            chain.insert(1, v)
            v = prev[v]
        chain.append(start)
        steps = []
        for a, b in zip(chain, chain[1:]):
            off = graph[a][b]
            steps.append(f"{crate.shown(a)}:{crate.sources[a].line(off)} -> {crate.shown(b)}")
        others = sorted(members - set(chain))
        more = f" (same cycle also holds {', '.join(crate.shown(x) for x in others)})" if others else ""
        finding(out, crate, start, graph[start][chain[1]], "c",
                "import cycle: " + "; ".join(steps) + more)


def rule_constants(crate, out):
    where = {}
    for rel, src in crate.live_sources():
        for name, off in src.consts:
            if src.in_test(off):
                continue
            where.setdefault(name, []).append((rel, off))
            bare = name[len("IBV_WC_"):] if name.startswith("IBV_WC_") else name
            if bare in WC_STATUS_NAMES:
                finding(out, crate, rel, off, "d",
                        f"`{name}` re-declares an ibv_wc_status value; use rdma_sys::ibv_wc_status")
    for name, defs in sorted(where.items()):
        files = sorted({rel for rel, _ in defs})
        if len(files) < 2:
            continue
        allowed = DUPLICATE_ALLOWED.get((crate.name, name))
        if allowed and all(f.startswith(allowed[0]) for f in files):
            continue
        for rel, off in defs:
            others = ", ".join(crate.shown(f) for f in files if f != rel)
            finding(out, crate, rel, off, "d", f"`{name}` is also defined in {others}: define it once")


def rule_fn_length(crate, out):
    for rel, src in crate.live_sources():
        for name, start, end in src.fns:
            if src.in_test(start):
                continue
            lines = src.line(end) - src.line(start) + 1
            if lines > MAX_FN_LINES:
                finding(out, crate, rel, start, "e",
                        f"fn {name} is {lines} lines (at most {MAX_FN_LINES}): split it")


def rule_unsafe_docs(crate, out):
    for rel, src in crate.live_sources():
        raw = src.text.split("\n")
        for m in UNSAFE_FN.finditer(src.code):
            off = m.start()
            if src.in_test(off):
                continue
            ln = src.line(off)
            docs = []
            k = ln - 2
            depth = 0  # inside a multi-line attribute, read upwards
            while k >= 0:
                t = raw[k].strip()
                if depth:
                    depth += t.count("]") - t.count("[")
                    if t.startswith("#"):
                        depth = 0
                elif t.startswith("///") or t.startswith("//!"):
                    docs.append(t)
                elif t.startswith("#[") or t.startswith("//") or t.startswith("#!["):
                    pass
                elif t.endswith(")]") or t.endswith("]"):
                    depth = 1
                else:
                    break
                k -= 1
            if not any(re.match(r"///\s*#\s+Safety\b", d) for d in docs):
                finding(out, crate, rel, off, "f",
                        f"unsafe fn {m.group(2)} has no `# Safety` section in its doc comment")


RULES = [rule_forbidden_imports, rule_cycles, rule_constants, rule_fn_length, rule_unsafe_docs]


def check(repo):
    crates = []
    if os.path.isfile(os.path.join(repo, "src", "lib.rs")):
        crates.append(Crate("ferroce", os.path.join(repo, "src"), "src"))
    soft = os.path.join(repo, "softroce", "src")
    if os.path.isfile(os.path.join(soft, "lib.rs")):
        crates.append(Crate("softroce", soft, os.path.join("softroce", "src")))
    out = []
    for crate in crates:
        for rule in RULES:
            rule(crate, out)
    return crates, sorted(set(out))


# ------------------------------------------------------------------------------------------
# Self-test: one fixture per rule (each must fail with exactly that rule), and a clean one.
# ------------------------------------------------------------------------------------------

CLEAN = {
    "src/lib.rs": "pub mod error;\npub mod transport;\npub mod api;\n#[macro_use]\npub mod log;\n",
    "src/log.rs": "#[macro_export]\nmacro_rules! log_warn { ($($a:tt)*) => { $crate::log::emit() } }\npub fn emit() {}\n",
    "src/error.rs": "pub struct Error;\npub const LIMIT: usize = 1;\n",
    "src/api.rs": (
        "use crate::transport::{self, Comm};\n"
        "pub fn open() -> Comm { crate::log_warn!(\"x\"); transport::open() }\n"
    ),
    "src/transport/mod.rs": (
        "pub mod conn;\npub mod proto;\npub mod registration;\n"
        "pub use conn::{open, Comm};\npub use registration::Handle;\n"
    ),
    "src/transport/conn.rs": (
        "use super::Handle;\nuse super::proto::setup::State;\n"
        "pub struct Comm(Handle, State);\n"
        "/// Opens.\n///\n/// # Safety\n/// None needed.\n#[allow(unused)]\npub unsafe fn raw() {}\n"
        "pub fn open() -> Comm { unsafe { raw() }; Comm(Handle, State::Idle) }\n"
        "pub fn short() {\n" + "    let _x = 1;\n" * 98 + "}\n"
        "#[cfg(test)]\nmod tests {\n    use crate::api;\n    const LIMIT: u8 = 2;\n"
        "    unsafe fn undocumented() {}\n    fn long() {\n" + "        let _x = 1;\n" * 120 + "    }\n}\n"
    ),
    "src/transport/registration.rs": "pub struct Handle;\nconst PAGE: usize = 4096;\n",
    "src/transport/proto/mod.rs": "#![forbid(unsafe_code)]\npub mod setup;\n",
    "src/transport/proto/setup.rs": (
        "use crate::error::Error;\nuse std::time::Duration;\n"
        "pub enum State { Idle }\npub fn timeout(_e: Error, _d: Duration) {}\n"
        "#[cfg(test)]\nmod tests { use std::net::TcpStream; }\n"
    ),
    "softroce/src/lib.rs": "pub mod wire;\npub mod proto;\npub mod verbs;\n",
    "softroce/src/wire/mod.rs": "pub mod bth;\npub mod reth;\npub fn parse() -> usize { bth::HEADER_LEN + reth::HEADER_LEN }\n",
    "softroce/src/wire/bth.rs": "pub const HEADER_LEN: usize = 12;\nmod field { pub const PSN: usize = 9; }\npub fn psn() -> usize { field::PSN }\n",
    "softroce/src/wire/reth.rs": "pub const HEADER_LEN: usize = 16;\nmod field { pub const PSN: usize = 0; }\n",
    # Comments, strings and char literals name nothing.
    "softroce/src/proto/mod.rs": (
        "use crate::wire;\n// crate::verbs is the layer above\n/* super::verbs::x */\n"
        "pub fn run() -> usize { let _q = '\\''; let _s = \"crate::verbs::call()\"; wire::parse() }\n"
    ),
    "softroce/src/verbs/mod.rs": "pub mod qp;\npub fn call() -> usize { 1 }\nconst PAGE: usize = 1;\n",
    "softroce/src/verbs/qp.rs": "use crate::proto;\npub fn post() -> usize { proto::run() + super::call() }\n",
}

BROKEN = {
    "a": {"softroce/src/proto/mod.rs": "use crate::verbs::call;\npub fn run() -> usize { call() }\n"},
    "a2": {"softroce/src/wire/reth.rs": "pub const HEADER_LEN: usize = 16;\npub fn f() -> usize { super::super::verbs::call() }\n"},
    "b-ibv": {"src/transport/proto/setup.rs": "use crate::ibv::QueuePair;\npub enum State { Idle }\n"},
    "b-net": {"src/transport/proto/setup.rs": "pub enum State { Idle(std::net::SocketAddr) }\n"},
    "b-instant": {"src/transport/proto/setup.rs": "use std::time::{Duration, Instant};\npub enum State { Idle }\n"},
    "b-libc": {"src/transport/proto/setup.rs": "pub enum State { Idle }\npub fn f() { let _ = libc::getpid(); }\n"},
    "b-io": {"src/transport/proto/setup.rs": "use super::super::registration::Handle;\npub enum State { Idle }\n"},
    "b-log": {"src/transport/proto/setup.rs": "pub enum State { Idle }\npub fn f() { crate::log::emit(); }\n"},
    "c": {"src/transport/registration.rs": "use super::conn::Comm;\npub struct Handle;\npub fn f(_c: Comm) {}\n"},
    "c3": {
        "src/error.rs": "pub struct Error;\npub const LIMIT: usize = 1;\npub fn f() { crate::api::open(); }\n",
    },
    "d": {"src/transport/registration.rs": "pub struct Handle;\npub const LIMIT: usize = 1;\n"},
    "d-static": {"softroce/src/proto/mod.rs": "use crate::wire;\nstatic PAGE: u8 = 0;\npub fn run() -> usize { wire::parse() }\n"},
    "d-allowed-elsewhere": {"softroce/src/verbs/qp.rs": "use crate::proto;\npub const HEADER_LEN: usize = 2;\npub fn post() -> usize { proto::run() }\n"},
    "d-wc": {"src/error.rs": "pub struct Error;\npub const LIMIT: usize = 1;\npub mod status { pub const WR_FLUSH_ERR: u32 = 5; }\n"},
    "e": {"src/transport/registration.rs": "pub struct Handle;\npub fn long(x: [u8; 2]) {\n" + "    let _y = x;\n" * 100 + "}\n"},
    "f": {"src/transport/registration.rs": "pub struct Handle;\n/// Does it.\npub unsafe extern \"C\" fn raw() {}\n"},
    "f2": {"src/transport/registration.rs": "pub struct Handle;\n/// Does it.\n///\n/// Safety: none\n#[inline]\nunsafe fn raw() {}\n"},
}


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)


def self_test():
    ok = True
    with tempfile.TemporaryDirectory(prefix="layers-selftest.") as tmp:
        clean = os.path.join(tmp, "clean")
        write_tree(clean, CLEAN)
        _, found = check(clean)
        if found:
            ok = False
            print("self-test: the clean fixture has findings:")
            for f in found:
                print("  %s:%d: [%s] %s" % f)
        for case, change in sorted(BROKEN.items()):
            root = os.path.join(tmp, case)
            write_tree(root, {**CLEAN, **change})
            _, found = check(root)
            rules = {f[2] for f in found}
            want = case[0]
            if rules != {want}:
                ok = False
                print(f"self-test: fixture {case} should break rule {want} only, found {sorted(rules) or 'nothing'}:")
                for f in found:
                    print("  %s:%d: [%s] %s" % f)
    print("self-test: %s (%d broken fixtures, 1 clean)" % ("ok" if ok else "FAILED", len(BROKEN)))
    return ok


def main(argv):
    if "--self-test" in argv:
        return 0 if self_test() else 1
    repo = argv[1] if len(argv) > 1 else os.getcwd()
    _, found = check(repo)
    for f in found:
        print("%s:%d: [%s] %s" % f)
    print(f"layers: {len(found)} finding(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
