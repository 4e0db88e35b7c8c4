#!/usr/bin/env python3
"""The design checks of the plugin (src/), softroce (softroce/src) and ferroce-doctor
(doctor/src), run by ci/tests/05-layers.sh; ci/layers_test.py shows each rule firing.

Rules, each finding printed as `path:line: [rule] message`:

  a  Rank order: a module names only modules of its own rank or lower (RANKS, from the README's
     "Layout"), even where no cycle closes. A module is ranked by the longest module-path
     prefix RANKS lists, so a new subfolder inherits its parent's rank; a top-level module
     RANKS does not list is a finding (place it). The crate root (lib.rs, main.rs) declares
     the modules and is not ranked.
  b  Sans-IO folders (SANS_IO) read no clock, open no socket or file, read no environment and
     spawn no thread or process (SANS_IO_FORBIDDEN), and name only the crate modules listed.
  c  No import cycle between the files of a crate (the crate root's items excepted).
  d  A module-level `const`/`static` name is defined in one file of a crate only; values of
     `enum ibv_wc_status` are never re-declared (they come from rdma-sys).
  e  Functions: none over MAX_FN_LINES_HARD lines; over MAX_FN_LINES, listed in a WARN
     (report-only) or a finding with LAYERS_ENFORCE_SIZE=1.
  f  Every `unsafe fn` has a `# Safety` section in its doc comment.
  g  The crate roots in UNSAFE_LINT_ROOTS carry `clippy::undocumented_unsafe_blocks` (deny or
     warn; CI runs clippy with -D warnings), so every `unsafe {}` has its `// SAFETY:` comment.
  h  Files over MAX_FILE_LINES lines (test files excepted): a WARN, or a finding with
     LAYERS_ENFORCE_SIZE=1.
  i  Every `extern "C" fn` (a callback from C or libc: the exported ABI and verbs, atexit hooks,
     thread entry points) runs behind the panic guard: its body starts with one of GUARDS, or
     only hands its arguments to a function whose body does (closure definitions may come
     first; they run nothing). UNGUARDED_KNOWN lists today's exceptions (a WARN each). A
     function a macro defines (`fn $name`, softroce's enosys_cmds! stubs) is not seen.

Test code (`#[cfg(test)]` items and modules, `#[test]` functions, files behind
`#[cfg(test)] mod x;`) and `tests/` folders are not read. ci/layers_scan.py says how files,
uses and paths are read.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layers_scan import Crate  # noqa: E402

# The crates checked: (name, source folder). The first file of each is lib.rs, else main.rs.
CRATES = [("ferroce", "src"), ("softroce", os.path.join("softroce", "src")), ("doctor", os.path.join("doctor", "src"))]

# Rule a. Per crate, low to high: (rank, module path prefixes, what the layer is). README
# "Layout": the plugin's foundations -> ibv -> device -> transport -> api -> abi, with the
# transport's sans-IO core below everything that does I/O; softroce's wire -> proto -> driver ->
# verbs, its config between the core and the driver that reads it; the doctor's checks and probes
# below the host checklist, below the pair checks.
RANKS = {
    "ferroce": [
        (0, ("config", "log", "error", "memory", "profiler"), "foundations"),
        (1, ("transport::proto",), "the transport's sans-IO core"),
        (2, ("ibv",), "libibverbs loaded at run time, RAII verbs objects"),
        (3, ("device",), "discovery, GID selection, properties"),
        (4, ("transport",), "the transport's I/O layer"),
        (5, ("api", "report", "stats_file"), "the one internal API and what reports through it"),
        (6, ("abi",), "the exported ncclNetPlugin_vN tables"),
    ],
    "softroce": [
        (0, ("wire",), "RoCEv2 headers, ICRC"),
        (1, ("proto",), "the sans-IO RC core"),
        (2, ("config",), "the environment tunables"),
        (3, ("driver",), "the NIC: device, memory, CQs, engine, UDP"),
        (4, ("verbs",), "the exported C ABI"),
        (5, ("bin",), "the tools"),
    ],
    "doctor": [
        (0, ("check", "sysinfo"), "a check's record and printing; facts of this host"),
        (1, ("env", "limits", "measure"), "the environment, limits and measurements"),
        (2, ("host",), "the host checklist"),
        (3, ("pair",), "the checks between two hosts"),
    ],
}

# Rule b: (crate, folder, crate modules it may name besides itself, or None: rule a decides).
SANS_IO = [
    ("ferroce", "transport/proto/", ("error",)),
    ("softroce", "wire/", None),
    ("softroce", "proto/", None),
]
# Path prefixes a sans-IO folder never names, and why.
SANS_IO_FORBIDDEN = [
    (("std", "thread"), "std::thread (the core spawns no thread)"),
    (("std", "process"), "std::process (the core spawns no process)"),
    (("std", "fs"), "std::fs (the core opens no file)"),
    (("std", "env"), "std::env (configuration is an argument)"),
    (("std", "net"), "std::net (sockets)"),
    (("core", "net"), "core::net (sockets)"),
    (("std", "os"), "std::os (file descriptors, sockets)"),
    (("std", "time", "Instant"), "std::time::Instant (a clock read; time is an argument)"),
    (("std", "time", "SystemTime"), "std::time::SystemTime (a clock read; time is an argument)"),
    (("libc",), "libc (system calls, sockets)"),
    (("nix",), "nix (system calls, sockets)"),
    (("socket2",), "socket2 (sockets)"),
    (("mio",), "mio (sockets)"),
]

MAX_FN_LINES_HARD = 100
MAX_FN_LINES = 80
MAX_FILE_LINES = 700
# LAYERS_ENFORCE_SIZE=1 turns the size WARNs (rules e over MAX_FN_LINES, h) into findings.
ENFORCE_SIZE_VAR = "LAYERS_ENFORCE_SIZE"

# Rule g: crate -> its root file.
UNSAFE_LINT_ROOTS = {"ferroce": "lib.rs", "softroce": "lib.rs", "doctor": "main.rs"}
UNSAFE_LINT = re.compile(r"#!\[\s*(deny|warn|forbid)\s*\([^)]*\bclippy::undocumented_unsafe_blocks\b")

# Rule i: how a guarded body starts (matched on code with comments blanked).
GUARDS = [
    re.compile(r"(let\s+_\s*=\s*)?((crate|super)::)*(abi::)?ffi::call(_traced)?\s*\("),
    re.compile(r"(let\s+_\s*=\s*)?(::)?(std::panic::)?catch_unwind\s*\("),
    re.compile(r"((\$crate|crate)::verbs::)?ffi_guard!\s*[({]"),
]
# (crate, function) -> why it is not guarded yet; each prints a WARN until it is (then remove it).
UNGUARDED_KNOWN = {}


def finding(out, crate, rel, off, rule, msg):
    out.append((crate.shown(rel), crate.sources[rel].line(off), rule, msg))


def enforce_size():
    return os.environ.get(ENFORCE_SIZE_VAR) == "1"


# ------------------------------------------------------------------------------------------
# a: rank order
# ------------------------------------------------------------------------------------------

def rank_of(crate, module):
    """(rank, prefix, what) of a module path (a tuple), or None when no prefix is listed."""
    best = None
    for rank, prefixes, what in RANKS.get(crate.name, []):
        for p in prefixes:
            parts = tuple(p.split("::"))
            if module[: len(parts)] == parts and (best is None or len(parts) > len(best[1])):
                best = (rank, parts, what)
    return best


def rule_rank(crate, out, warn):
    if crate.name not in RANKS:
        return
    unranked = set()
    for rel, _ in crate.live_sources():
        mod = crate.module_of(rel)
        if mod and rank_of(crate, mod) is None and mod[:1] not in unranked:
            unranked.add(mod[:1])
            finding(out, crate, rel, 0, "a", f"module {'::'.join(mod[:1])} has no rank: add it to RANKS in ci/layers.py")
    for rel, targets in sorted(crate.edges().items()):
        src_mod = crate.module_of(rel)
        mine = rank_of(crate, src_mod) if src_mod else None
        if mine is None:
            continue
        for target, off in sorted(targets.items()):
            dst_mod = crate.module_of(target)
            theirs = rank_of(crate, dst_mod) if dst_mod else None
            if theirs is not None and theirs[0] > mine[0]:
                finding(out, crate, rel, off, "a",
                        f"{'::'.join(src_mod)} (rank {mine[0]}, {mine[2]}) names {crate.shown(target)} "
                        f"(rank {theirs[0]}, {theirs[2]}): a layer names only its own rank or lower")


# ------------------------------------------------------------------------------------------
# b: the sans-IO folders
# ------------------------------------------------------------------------------------------

def rule_sans_io(crate, out, warn):
    for name, folder, allowed in SANS_IO:
        if name != crate.name:
            continue
        own = tuple(folder.strip("/").split("/"))
        for rel, off, absp, segs, is_pub, bound in crate.refs:
            if not rel.replace(os.sep, "/").startswith(folder):
                continue
            shown = "::".join(segs)
            why = None
            for prefix, reason in SANS_IO_FORBIDDEN:
                if segs[: len(prefix)] == prefix or (len(prefix) == 3 and segs[:2] == prefix[:2] and prefix[2] in segs):
                    why = reason
                    break
            if why is None and allowed is not None and absp:
                if absp[: len(own)] != own and absp[:1] not in [(a,) for a in allowed]:
                    why = f"crate::{absp[0]} (it may name crate::{', crate::'.join(allowed)} only)"
            if why:
                finding(out, crate, rel, off, "b", f"the sans-IO {folder} names {why}: {shown}")


# ------------------------------------------------------------------------------------------
# c: import cycles
# ------------------------------------------------------------------------------------------

def rule_cycles(crate, out, warn):
    # The crate root names every module; what it defines (ferroce's VERSION, the doctor's
    # `Vars`) every module may use, so an edge into it closes no cycle of interest.
    root = crate.files.get(())
    graph = {a: {b: off for b, off in e.items() if b != root} for a, e in crate.edges().items()}
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
        report_cycle(crate, graph, comp, out)


def report_cycle(crate, graph, comp, out):
    """One finding per cycle: a shortest loop through its first file."""
    members = set(comp)
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
        steps.append(f"{crate.shown(a)}:{crate.sources[a].line(graph[a][b])} -> {crate.shown(b)}")
    others = sorted(members - set(chain))
    more = f" (same cycle also holds {', '.join(crate.shown(x) for x in others)})" if others else ""
    finding(out, crate, start, graph[start][chain[1]], "c", "import cycle: " + "; ".join(steps) + more)


# ------------------------------------------------------------------------------------------
# d: constants
# ------------------------------------------------------------------------------------------

# `enum ibv_wc_status` (rdma-sys), without the IBV_WC_ prefix; SUCCESS is left out (too
# common a name: NCCL's ncclSuccess is another SUCCESS).
WC_STATUS_NAMES = {
    "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
    "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",
    "REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",
    "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR",
    "RESP_TIMEOUT_ERR", "GENERAL_ERR", "TM_ERR", "TM_RNDV_INCOMPLETE",
}

# Names allowed in more than one file of a crate: (crate, name) -> (the folder every
# definition must lie in, the reason). Field offsets inside a `mod field` (the byte layout of
# one header, smoltcp style) are not module-level constants of the crate and are not listed.
DUPLICATE_ALLOWED = {
    ("softroce", "HEADER_LEN"): (
        "wire" + os.sep,
        "each wire header module states its own length (bth::HEADER_LEN, reth::HEADER_LEN, ...)",
    ),
}


def rule_constants(crate, out, warn):
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


# ------------------------------------------------------------------------------------------
# e, h: sizes
# ------------------------------------------------------------------------------------------

def rule_fn_length(crate, out, warn):
    for rel, src in crate.live_sources():
        for name, start, end in src.fns:
            if src.in_test(start):
                continue
            lines = src.line(end) - src.line(start) + 1
            where = f"{crate.shown(rel)}:{src.line(start)} {name} ({lines})"
            if lines > MAX_FN_LINES_HARD:
                finding(out, crate, rel, start, "e",
                        f"fn {name} is {lines} lines (at most {MAX_FN_LINES_HARD}): split it")
            elif lines > MAX_FN_LINES:
                if enforce_size():
                    finding(out, crate, rel, start, "e", f"fn {name} is {lines} lines (at most {MAX_FN_LINES}): split it")
                else:
                    warn.setdefault(f"functions over {MAX_FN_LINES} lines", []).append(where)


def rule_file_length(crate, out, warn):
    for rel, src in crate.live_sources():
        lines = src.text.count("\n") + (0 if src.text.endswith("\n") or not src.text else 1)
        if lines <= MAX_FILE_LINES:
            continue
        if enforce_size():
            finding(out, crate, rel, 0, "h", f"{lines} lines (at most {MAX_FILE_LINES}): split the file")
        else:
            warn.setdefault(f"files over {MAX_FILE_LINES} lines", []).append(f"{crate.shown(rel)} ({lines})")


# ------------------------------------------------------------------------------------------
# f, g: unsafe
# ------------------------------------------------------------------------------------------

UNSAFE_FN = re.compile(r'\bunsafe\s+(extern\s+"[^"]*"\s+)?fn\s+([A-Za-z_]\w*)')


def rule_unsafe_docs(crate, out, warn):
    for rel, src in crate.live_sources():
        raw = src.text.split("\n")
        for m in UNSAFE_FN.finditer(src.code):
            off = m.start()
            if src.in_test(off):
                continue
            if not any(re.match(r"///\s*#\s+Safety\b", d) for d in doc_lines(raw, src.line(off))):
                finding(out, crate, rel, off, "f",
                        f"unsafe fn {m.group(2)} has no `# Safety` section in its doc comment")


def doc_lines(raw, ln):
    """The `///` lines above line `ln` (1-based), across attributes and plain comments."""
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
    return docs


def rule_unsafe_lint(crate, out, warn):
    root = UNSAFE_LINT_ROOTS.get(crate.name)
    if root is None or root not in crate.sources:
        return
    if not UNSAFE_LINT.search(crate.sources[root].text):
        finding(out, crate, root, 0, "g",
                "no #![deny(clippy::undocumented_unsafe_blocks)]: every unsafe block states its SAFETY")


# ------------------------------------------------------------------------------------------
# i: the panic guard of callbacks from C
# ------------------------------------------------------------------------------------------

EXTERN_FN = re.compile(r'extern\s+"[^"]*"\s+$')


def skip_statement(code, i):
    """The offset after the `;` that ends the statement at `i` (brackets balanced)."""
    depth = 0
    while i < len(code):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return i


def matching(code, i):
    """The offset after the bracket that closes the one at `i`."""
    depth = 0
    while i < len(code):
        if code[i] in "([{":
            depth += 1
        elif code[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def is_guarded(body, guarded):
    """Whether a function body (code between its braces) starts with the guard or only hands
    its arguments on to a guarded function."""
    body = body.strip()
    while True:
        # Closure definitions and const items run nothing.
        m = re.match(r"let\s+(mut\s+)?\w+\s*=\s*(move\s*)?\||const\s+\w+\s*:", body)
        if not m:
            break
        body = body[skip_statement(body, 0):].strip()
    m = re.match(r"unsafe\s*\{", body)
    if m and matching(body, m.end() - 1) == len(body):
        body = body[m.end():-1].strip()
    if not body or any(g.match(body) for g in GUARDS):
        return True
    m = re.match(r"((?:\w+\s*::\s*)*)(\w+)\s*(::\s*<[^()]*>\s*)?\(", body)
    if m and m.group(2) in guarded:
        rest = body[matching(body, m.end() - 1):].strip()
        return rest in ("", ";")
    return False


def rule_guard(crate, out, warn):
    fns = []  # (rel, name, start, body, is_extern)
    for rel, src in crate.live_sources():
        for name, start, end in src.fns:
            brace = src.code.index("{", start)
            ext = bool(EXTERN_FN.search(src.code[max(0, start - 40):start]))
            fns.append((rel, name, start, src.code[brace + 1:end], ext))
    guarded = set()
    changed = True
    while changed:
        changed = False
        for rel, name, start, body, ext in fns:
            if name not in guarded and is_guarded(body, guarded):
                guarded.add(name)
                changed = True
    known = {name for (c, name) in UNGUARDED_KNOWN if c == crate.name}
    for rel, name, start, body, ext in fns:
        if not ext or name in guarded:
            continue
        if name in known:
            known.discard(name)
            warn.setdefault("extern \"C\" fns not behind the panic guard yet (UNGUARDED_KNOWN)", []).append(
                f"{crate.shown(rel)}:{crate.sources[rel].line(start)} {name}: {UNGUARDED_KNOWN[(crate.name, name)]}")
            continue
        finding(out, crate, rel, start, "i",
                f"extern \"C\" fn {name} does not start with the panic guard (ffi::call, ffi_guard!, "
                "catch_unwind) nor only call a function that does")
    for name in sorted(known):
        warn.setdefault("UNGUARDED_KNOWN entries to remove (guarded or gone now)", []).append(f"{crate.name}: {name}")


RULES = [rule_rank, rule_sans_io, rule_cycles, rule_constants, rule_fn_length, rule_file_length,
         rule_unsafe_docs, rule_unsafe_lint, rule_guard]


def check(repo):
    """(findings, warnings): sorted (path, line, rule, message) tuples, {what: [entries]}."""
    out, warn = [], {}
    for name, folder in CRATES:
        root = os.path.join(repo, folder)
        if not (os.path.isfile(os.path.join(root, "lib.rs")) or os.path.isfile(os.path.join(root, "main.rs"))):
            continue
        crate = Crate(name, root, folder)
        for rule in RULES:
            rule(crate, out, warn)
    return sorted(set(out)), warn


def main(argv):
    repo = argv[1] if len(argv) > 1 else os.getcwd()
    found, warn = check(repo)
    for what, entries in sorted(warn.items()):
        print(f"WARN layers: {len(entries)} {what}: " + "; ".join(sorted(entries)))
    for f in found:
        print("%s:%d: [%s] %s" % f)
    print(f"layers: {len(found)} finding(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
