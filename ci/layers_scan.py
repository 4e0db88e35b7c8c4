"""What ci/layers.py reads of a crate: Rust source lexed just enough for its rules.

`strip` blanks comments and literal contents (keeping offsets and newlines); `Source` finds one
file's blocks, `use` statements, `mod` declarations, module-level consts, functions and test
regions; `Crate` maps files to module paths and resolves `use` trees and path expressions to the
files they name (the import graph of the rank and cycle rules). Not a Rust parser: macro
bodies are text, and a path a macro builds is no edge.
"""

import os
import re

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


