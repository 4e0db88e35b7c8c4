#!/usr/bin/env python3
"""The self-test of ci/layers.py (run by ci/tests/05-layers.sh): a clean fixture tree must give
no finding, and each broken one (the clean tree with one planted violation) exactly the rules
it names. The size rules are checked both ways: report-only (a WARN naming the planted
function or file, no finding) and enforcing (LAYERS_ENFORCE_SIZE=1: a finding), with the
limits themselves passing (80 lines, 700 lines)."""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layers  # noqa: E402


def lines_fn(name, n, indent=""):
    """A function of exactly `n` lines (`fn` to its closing brace)."""
    return f"{indent}pub fn {name}() {{\n" + f"{indent}    let _x = 1;\n" * (n - 2) + f"{indent}}}\n"


def padded(text, n):
    """`text` padded with comment lines to exactly `n` lines."""
    return text + "// pad\n" * (n - text.count("\n"))


REGISTRATION = "pub struct Handle;\nconst PAGE: usize = 4096;\n"

CLEAN = {
    "src/lib.rs": (
        "#![deny(clippy::undocumented_unsafe_blocks)]\n"
        "pub const VERSION: &str = \"1\";\n"
        "pub mod error;\npub mod transport;\npub mod api;\npub mod ibv;\npub mod abi;\n#[macro_use]\npub mod log;\n"
    ),
    "src/log.rs": "#[macro_export]\nmacro_rules! log_warn { ($($a:tt)*) => { $crate::log::emit() } }\npub fn emit() {}\n",
    "src/error.rs": "pub struct Error;\npub const LIMIT: usize = 1;\n",
    "src/ibv.rs": "use crate::error::Error;\npub struct QueuePair;\npub fn open() -> Result<QueuePair, Error> { Ok(QueuePair) }\n",
    "src/api.rs": (
        "use crate::transport::{self, Comm};\n"
        "pub fn open() -> Comm { crate::log_warn!(\"x\"); transport::open() }\n"
    ),
    # The panic guard: started by ffi::call, or handed on to a function that starts with it
    # (also inside `unsafe {}`, after closure definitions and consts).
    "src/abi/mod.rs": (
        "pub mod ffi;\nuse crate::api;\n"
        "pub extern \"C\" fn open() -> i32 { ffi::call(|| { api::open(); }) }\n"
        "fn guarded(n: i32) -> i32 { ffi::call(move || { let _ = n; }) }\n"
        "/// # Safety\n/// None.\npub unsafe extern \"C\" fn open_v2(n: i32) -> i32 {\n"
        "    // SAFETY: none needed.\n    unsafe { open_v3(n) }\n}\n"
        "/// # Safety\n/// None.\npub unsafe extern \"C\" fn open_v3(n: i32) -> i32 {\n"
        "    let describe = || format!(\"{n}\");\n    const ERR: i32 = -1;\n    guarded(n + ERR + describe().len() as i32)\n}\n"
        "extern \"C\" fn at_exit() {\n    let _ = std::panic::catch_unwind(|| crate::log::emit());\n}\n"
        "pub extern \"C\" fn nothing() {}\n"
    ),
    "src/abi/ffi.rs": "pub fn call(body: impl FnOnce()) -> i32 { std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).map_or(1, |_| 0) }\n",
    "src/transport/mod.rs": (
        "pub mod conn;\npub mod proto;\npub mod registration;\n"
        "pub use conn::{open, Comm};\npub use registration::Handle;\n"
    ),
    "src/transport/conn.rs": (
        "use super::Handle;\nuse super::proto::setup::State;\n"
        "pub struct Comm(Handle, State);\n"
        "/// Opens.\n///\n/// # Safety\n/// None needed.\n#[allow(unused)]\npub unsafe fn raw() {}\n"
        "pub fn open() -> Comm { unsafe { raw() }; let _v = crate::VERSION; Comm(Handle, State::Idle) }\n"
        + lines_fn("at_the_limit", 80)
        + "#[cfg(test)]\nmod tests {\n    use crate::api;\n    const LIMIT: u8 = 2;\n"
        "    unsafe fn undocumented() {}\n    extern \"C\" fn unguarded() {}\n" + lines_fn("long", 120, "    ") + "}\n"
    ),
    "src/transport/registration.rs": padded(REGISTRATION, 700),
    "src/transport/proto/mod.rs": "#![forbid(unsafe_code)]\npub mod setup;\n",
    "src/transport/proto/setup.rs": (
        "use crate::error::Error;\nuse std::time::Duration;\n"
        "pub enum State { Idle }\npub fn timeout(_e: Error, _d: Duration) {}\n"
        "#[cfg(test)]\nmod tests { use std::net::TcpStream; }\n"
    ),
    "softroce/src/lib.rs": "#![warn(clippy::undocumented_unsafe_blocks)]\npub mod wire;\npub mod proto;\npub mod config;\npub mod verbs;\n",
    "softroce/src/wire/mod.rs": "pub mod bth;\npub mod reth;\npub fn parse() -> usize { bth::HEADER_LEN + reth::HEADER_LEN }\n",
    "softroce/src/wire/bth.rs": "pub const HEADER_LEN: usize = 12;\nmod field { pub const PSN: usize = 9; }\npub fn psn() -> usize { field::PSN }\n",
    "softroce/src/wire/reth.rs": "pub const HEADER_LEN: usize = 16;\nmod field { pub const PSN: usize = 0; }\n",
    # Comments, strings and char literals name nothing; the core's own Instant is no clock.
    "softroce/src/proto/mod.rs": (
        "use crate::wire;\n// crate::verbs is the layer above\n/* super::verbs::x */\n"
        "pub struct Instant(pub u64);\n"
        "pub fn run(_now: Instant) -> usize { let _q = '\\''; let _s = \"crate::verbs::call()\"; wire::parse() }\n"
    ),
    "softroce/src/config.rs": "pub fn mtu() -> usize { crate::wire::parse() + std::env::var(\"X\").map_or(0, |v| v.len()) }\n",
    "softroce/src/verbs/mod.rs": (
        "pub mod qp;\npub fn call() -> usize { crate::config::mtu() }\nconst PAGE: usize = 1;\n"
        "macro_rules! ffi_guard { ($e:expr, $b:block) => { std::panic::catch_unwind(|| $b).unwrap_or($e) } }\n"
        "#[no_mangle]\npub extern \"C\" fn ibv_call() -> usize { ffi_guard!(0, { call() }) }\n"
    ),
    "softroce/src/verbs/qp.rs": "use crate::proto;\npub fn post() -> usize { proto::run(proto::Instant(0)) + super::call() }\n",
    "doctor/src/main.rs": "#![deny(clippy::undocumented_unsafe_blocks)]\nmod check;\nmod pair;\npub type Vars = Vec<String>;\nfn main() { pair::run(&Vars::new()); }\n",
    "doctor/src/check.rs": "pub struct Check;\n",
    "doctor/src/pair.rs": "use crate::check::Check;\npub fn run(_v: &crate::Vars) -> Option<Check> { None }\n",
}

ENFORCE = {"LAYERS_ENFORCE_SIZE": "1"}
PROTO = "src/transport/proto/setup.rs"
PROTO_HEAD = "pub enum State { Idle }\n"

# case -> (the rules it must break, the files it changes, the environment it runs with).
BROKEN = {
    # a: rank order, also where no cycle closes.
    "a-ibv-names-abi": ({"a"}, {"src/ibv.rs": "pub struct QueuePair;\npub fn f() -> i32 { crate::abi::open() }\n"}, {}),
    "a-device-layer-unranked": ({"a"}, {"src/lib.rs": CLEAN["src/lib.rs"] + "pub mod gadget;\n", "src/gadget.rs": "pub fn g() {}\n"}, {}),
    "a-softroce-proto-verbs": ({"a"}, {"softroce/src/proto/mod.rs": "use crate::verbs::call;\npub struct Instant(pub u64);\npub fn run(_n: Instant) -> usize { call() }\n"}, {}),
    "a-softroce-wire-verbs": ({"a"}, {
        "softroce/src/wire/mod.rs": CLEAN["softroce/src/wire/mod.rs"] + "pub mod grh;\n",
        "softroce/src/wire/grh.rs": "pub fn f() -> usize { super::super::verbs::call() }\n",
    }, {}),
    "a-softroce-proto-config": ({"a"}, {"softroce/src/proto/mod.rs": "pub struct Instant(pub u64);\npub fn run(_n: Instant) -> usize { crate::config::mtu() }\n"}, {}),
    "a-doctor-check-pair": ({"a"}, {
        "doctor/src/check.rs": "pub struct Check;\npub fn f() { crate::pair::run(&Vec::new()); }\n",
        "doctor/src/pair.rs": "pub fn run(_v: &crate::Vars) {}\n",
    }, {}),
    # b: the sans-IO folders.
    "b-ibv": ({"a", "b"}, {PROTO: "use crate::ibv::QueuePair;\n" + PROTO_HEAD}, {}),
    "b-net": ({"b"}, {PROTO: "pub enum State { Idle(std::net::SocketAddr) }\n"}, {}),
    "b-instant": ({"b"}, {PROTO: "use std::time::{Duration, Instant};\n" + PROTO_HEAD}, {}),
    "b-systemtime": ({"b"}, {PROTO: PROTO_HEAD + "pub fn f() { let _ = std::time::SystemTime::now(); }\n"}, {}),
    "b-thread": ({"b"}, {PROTO: PROTO_HEAD + "pub fn f() { std::thread::spawn(|| ()); }\n"}, {}),
    "b-fs": ({"b"}, {PROTO: "use std::fs::File;\n" + PROTO_HEAD}, {}),
    "b-env": ({"b"}, {PROTO: PROTO_HEAD + "pub fn f() -> bool { std::env::var(\"X\").is_ok() }\n"}, {}),
    "b-libc": ({"b"}, {PROTO: PROTO_HEAD + "pub fn f() { let _ = libc::getpid(); }\n"}, {}),
    "b-io-layer": ({"a", "b"}, {PROTO: "use super::super::registration::Handle;\n" + PROTO_HEAD}, {}),
    "b-log": ({"b"}, {PROTO: PROTO_HEAD + "pub fn f() { crate::log::emit(); }\n"}, {}),
    "b-softroce-wire-socket": ({"b"}, {"softroce/src/wire/reth.rs": "pub const HEADER_LEN: usize = 16;\nuse std::net::UdpSocket;\n"}, {}),
    "b-softroce-proto-clock": ({"b"}, {"softroce/src/proto/mod.rs": "use crate::wire;\npub struct Instant(pub u64);\npub fn run(_n: Instant) -> usize { let _t = std::time::Instant::now(); wire::parse() }\n"}, {}),
    # c: cycles.
    "c": ({"c"}, {"src/transport/registration.rs": "use super::conn::Comm;\npub struct Handle;\npub fn f(_c: Comm) {}\n"}, {}),
    "c-and-a": ({"a", "c"}, {"src/error.rs": "pub struct Error;\npub const LIMIT: usize = 1;\npub fn f() { crate::api::open(); }\n"}, {}),
    # d: constants.
    "d": ({"d"}, {"src/transport/registration.rs": "pub struct Handle;\npub const LIMIT: usize = 1;\n"}, {}),
    "d-static": ({"d"}, {"softroce/src/proto/mod.rs": "use crate::wire;\nstatic PAGE: u8 = 0;\npub struct Instant(pub u64);\npub fn run(_n: Instant) -> usize { wire::parse() }\n"}, {}),
    "d-allowed-elsewhere": ({"d"}, {"softroce/src/verbs/qp.rs": "use crate::proto;\npub const HEADER_LEN: usize = 2;\npub fn post() -> usize { proto::run(proto::Instant(0)) }\n"}, {}),
    "d-wc": ({"d"}, {"src/error.rs": "pub struct Error;\npub const LIMIT: usize = 1;\npub mod status { pub const WR_FLUSH_ERR: u32 = 5; }\n"}, {}),
    # e, h: sizes.
    "e-over-the-hard-limit": ({"e"}, {"src/transport/registration.rs": REGISTRATION + lines_fn("long", 101)}, {}),
    "e-81-lines-enforced": ({"e"}, {"src/transport/registration.rs": REGISTRATION + lines_fn("long", 81)}, ENFORCE),
    "h-701-lines-enforced": ({"h"}, {"src/transport/registration.rs": padded(REGISTRATION, 701)}, ENFORCE),
    # f, g: unsafe.
    "f": ({"f"}, {"src/transport/registration.rs": "pub struct Handle;\n/// Does it.\npub unsafe fn raw() {}\n"}, {}),
    "f2": ({"f"}, {"src/transport/registration.rs": "pub struct Handle;\n/// Does it.\n///\n/// Safety: none\n#[inline]\nunsafe fn raw() {}\n"}, {}),
    "g": ({"g"}, {"src/lib.rs": CLEAN["src/lib.rs"].replace("#![deny(clippy::undocumented_unsafe_blocks)]\n", "")}, {}),
    "g-doctor": ({"g"}, {"doctor/src/main.rs": CLEAN["doctor/src/main.rs"].replace("deny(clippy::undocumented_unsafe_blocks)", "deny(unused)")}, {}),
    # i: the panic guard.
    "i-unguarded-export": ({"i"}, {"src/abi/mod.rs": CLEAN["src/abi/mod.rs"] + "pub extern \"C\" fn close() -> i32 { crate::api::open(); 0 }\n"}, {}),
    "i-work-before-the-guard": ({"i"}, {"src/abi/mod.rs": CLEAN["src/abi/mod.rs"] + "pub extern \"C\" fn close() -> i32 { crate::log::emit(); guarded(1) }\n"}, {}),
    "i-atexit-hook": ({"i"}, {"src/transport/registration.rs": REGISTRATION + "pub extern \"C\" fn write_at_exit() { let _ = PAGE; }\n"}, {}),
    "i-softroce-verb": ({"i"}, {"softroce/src/verbs/qp.rs": "use crate::proto;\n#[no_mangle]\npub extern \"C\" fn ibv_post() -> usize { proto::run(proto::Instant(0)) }\n"}, {}),
}

# Report-only (the default): the planted size violations are a WARN naming them, no finding.
REPORTED = {
    "functions over 80 lines": ({"src/transport/registration.rs": REGISTRATION + lines_fn("long", 81)}, "registration.rs:3 long (81)"),
    "files over 700 lines": ({"src/transport/registration.rs": padded(REGISTRATION, 701)}, "registration.rs (701)"),
}


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)


def run(tmp, case, change, env, known=None):
    """layers.check of the clean tree with `change`, under `env`, with UNGUARDED_KNOWN `known`
    (none by default: the real list is about the real tree)."""
    root = os.path.join(tmp, case)
    write_tree(root, {**CLEAN, **change})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    real_known, layers.UNGUARDED_KNOWN = layers.UNGUARDED_KNOWN, known or {}
    try:
        return layers.check(root)
    finally:
        layers.UNGUARDED_KNOWN = real_known
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def show(found):
    for f in found:
        print("  %s:%d: [%s] %s" % f)


def self_test():
    ok = True
    with tempfile.TemporaryDirectory(prefix="layers-selftest.") as tmp:
        for case, env in (("clean", {}), ("clean-enforced", ENFORCE)):
            found, warn = run(tmp, case, {}, env)
            if found or (env and warn):
                ok = False
                print(f"self-test: the {case} fixture has findings or WARNs: {warn}")
                show(found)
        for case, (want, change, env) in sorted(BROKEN.items()):
            found, _ = run(tmp, case, change, env)
            rules = {f[2] for f in found}
            if rules != want:
                ok = False
                print(f"self-test: fixture {case} should break {sorted(want)}, found {sorted(rules) or 'nothing'}:")
                show(found)
        for what, (change, entry) in sorted(REPORTED.items()):
            found, warn = run(tmp, "reported-" + what.replace(" ", "-"), change, {})
            if found or not any(entry in e for e in warn.get(what, [])):
                ok = False
                print(f"self-test: report-only {what}: want a WARN naming {entry} and no finding; got {warn}")
                show(found)
        # An UNGUARDED_KNOWN entry turns its finding into a WARN; a stale one is a WARN too.
        change = BROKEN["i-atexit-hook"][1]
        found, warn = run(tmp, "known", change, {}, {("ferroce", "write_at_exit"): "why", ("ferroce", "gone"): "why"})
        listed = " ".join(" ".join(v) for v in warn.values())
        if found or "write_at_exit: why" not in listed or "ferroce: gone" not in listed:
            ok = False
            print(f"self-test: UNGUARDED_KNOWN: want WARNs for write_at_exit and the stale entry, no finding; got {warn}")
            show(found)
    print("self-test: %s (%d broken fixtures, %d report-only, 1 clean twice)"
          % ("ok" if ok else "FAILED", len(BROKEN), len(REPORTED)))
    return ok


if __name__ == "__main__":
    sys.exit(0 if self_test() else 1)
