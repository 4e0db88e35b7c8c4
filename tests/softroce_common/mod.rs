//! The one harness of the softroce-backed tests (`tests/*_softroce.rs`): their gate, the child
//! process a test runs its checks in, softroce's fault control, and what they share besides (a
//! connected pair on a device, a registration, one checked transfer through the API as NCCL
//! drives it).
//!
//! Every softroce-backed test is `#[ignore = "needs softroce: ..."]`, so a plain `cargo test`
//! on a host without softroce built reports it ignored, never passed. `make test` runs them with
//! `FERROCE_TEST_SOFTROCE=1 cargo test --release --workspace -- --include-ignored --skip bench_ --skip setup_stress_campaign`
//! after `make build` (docs/testing.md); run that way, a missing prerequisite (the gate, the
//! built library, softroce-ctl) fails the test with what to do ([`require_softroce`]).
#![allow(dead_code)]

use nccl_net_ferroce::api::{self, CommContext, RecvHandle, SendHandle};
use nccl_net_ferroce::device::{LinkLayer, VirtualDevice};
use nccl_net_ferroce::error::Error;
use nccl_net_ferroce::transport::{MemHandle, MemKind};
use std::ffi::c_void;
use std::process::Command;
use std::time::{Duration, Instant};

/// The variable that says a softroce-backed test may run: `make build` made softroce's
/// libibverbs and softroce-ctl.
pub const GATE: &str = "FERROCE_TEST_SOFTROCE";

/// The variable [`run_child`] sets in a child process to the name of the test it runs.
const CHILD: &str = "FERROCE_TEST_CHILD";

/// The softroce libibverbs the plugin loads in these tests: FERROCE_TEST_SOFTROCE_LIB when set
/// (ci/tests/80-sanitizers.sh points it at a ThreadSanitizer build of softroce), else the one
/// `softroce/build.sh` made.
pub fn softroce_lib() -> String {
    std::env::var("FERROCE_TEST_SOFTROCE_LIB")
        .unwrap_or_else(|_| format!("{}/target/release/softroce/libibverbs.so.1", env!("CARGO_MANIFEST_DIR")))
}

/// softroce's fault-control tool, which `softroce/build.sh` builds next to the library.
fn ctl_tool() -> String {
    format!("{}/target/release/softroce/softroce-ctl", env!("CARGO_MANIFEST_DIR"))
}

/// The prerequisites of a softroce-backed test: panics (the test fails) with what to do when
/// the gate is not set or softroce is not built. Called first by every such test, also when
/// it was asked for by name (`--ignored`), so that none can pass without softroce.
pub fn require_softroce() {
    assert!(
        std::env::var(GATE).as_deref() == Ok("1"),
        "a softroce-backed test: set {GATE}=1 after `make build` (make test does both), \
         or leave out --ignored/--include-ignored"
    );
    for path in [softroce_lib(), ctl_tool()] {
        assert!(
            std::path::Path::new(&path).exists(),
            "{path} missing: run `make build` (softroce/build.sh)"
        );
    }
}

/// The link layer softroce gives its ports in this run: InfiniBand when the run sets
/// `SOFTROCE_LINK_LAYER=ib` (ci/tests/23-plugin-ib.sh reruns tests so: docs/testing.md), else
/// RoCE. Children of [`run_child`] inherit it.
pub fn link_layer() -> LinkLayer {
    match std::env::var("SOFTROCE_LINK_LAYER").as_deref() {
        Ok("ib") => LinkLayer::InfiniBand,
        _ => LinkLayer::Ethernet,
    }
}

/// The start of the line [`assert_link_layer`] prints, which [`run_child`] passes on from a
/// child and ci/tests/23-plugin-ib.sh counts.
pub const LINK_LINE: &str = "softroce link layer:";

/// Checks that the comms on `dev` really run on ports of [`link_layer`] — on InfiniBand each
/// with the LID softroce's subnet-manager stand-in gives it, so QPs address their peers by LID
/// — and prints one line saying so, so that a run meant for InfiniBand cannot pass on RoCE.
pub fn assert_link_layer(dev: &VirtualDevice) {
    let want = link_layer();
    for m in &dev.members {
        assert_eq!(
            m.link_layer,
            want,
            "{}: SOFTROCE_LINK_LAYER asked for {want:?}",
            m.label()
        );
        match want {
            LinkLayer::InfiniBand => {
                assert_ne!(m.lid, 0, "{}: an active InfiniBand port has a LID", m.label());
                println!("{LINK_LINE} InfiniBand, {} LID {:#x}", m.label(), m.lid);
            }
            LinkLayer::Ethernet => println!("{LINK_LINE} Ethernet (RoCE), {}", m.label()),
        }
    }
}

/// Whether this process is the child process [`run_child`] started for `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(test)
}

/// The first line of a test that runs its checks in a child process: in that child (started by
/// [`run_child`] for `test`), runs `body`, prints "`test`: done" (which [`run_child`] looks
/// for) and returns true, and the test returns; in the parent returns false.
pub fn child(test: &str, body: impl FnOnce()) -> bool {
    if !is_child(test) {
        return false;
    }
    body();
    println!("{test}: done");
    true
}

/// Runs test `test` of this test binary (the caller) again as a child process, where [`child`]
/// runs its body: softroce as the plugin's libibverbs on `addr` (SOFTROCE_ADDR, "A,B" for two
/// devices), its own fault-control directory, the side channel on lo, a 10 s setup timeout,
/// with `env` on top. Its stdout and stderr, after checking that it passed and printed
/// "`test`: done". Checks the prerequisites first ([`require_softroce`]).
pub fn run_child(test: &str, addr: &str, env: &[(&str, &str)]) -> String {
    require_softroce();
    let dir = std::env::temp_dir().join(format!("ferroce-child-{test}-{}", std::process::id()));
    let out = child_command(test, addr, &dir)
        .envs(env.iter().copied())
        .output()
        .expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "child {test} failed:\n{text}");
    assert!(
        text.contains(&format!("{test}: done")),
        "the child {test} did not run its checks:\n{text}"
    );
    // (The child's test harness may print its "test NAME ... " on the same line.)
    for line in text.lines().filter_map(|l| l.find(LINK_LINE).map(|at| &l[at..])) {
        println!("{line}");
    }
    text
}

/// The command that runs test `test` of this test binary (the caller) as a child process, where
/// [`child`] runs its body: softroce as the plugin's libibverbs on `addr`, its fault-control
/// directory `ctl_dir`, the side channel on lo, a 10 s setup timeout. [`run_child`] runs one
/// and waits; a test that needs several at once (tests/setup_stress_softroce.rs) spawns them.
pub fn child_command(test: &str, addr: &str, ctl_dir: &std::path::Path) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args([
        test,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(CHILD, test)
    .env("NCCL_IBVERBS_LIB", softroce_lib())
    .env("SOFTROCE_ADDR", addr)
    .env("SOFTROCE_CTL_DIR", ctl_dir)
    .env("NCCL_SOCKET_IFNAME", "lo")
    .env("FERROCE_CONNECT_TIMEOUT_SEC", "10");
    c
}

/// `softroce-ctl ADDR ARGS...` (fault control of the softroce device on ADDR), which must
/// succeed. Inside a child of [`run_child`], it finds the child's devices through the
/// inherited SOFTROCE_CTL_DIR.
pub fn ctl(addr: &str, args: &[&str]) {
    let said = Command::new(ctl_tool())
        .arg(addr)
        .args(args)
        .output()
        .expect("softroce-ctl");
    assert!(
        said.status.success(),
        "softroce-ctl {addr} {args:?}: {}{}",
        String::from_utf8_lossy(&said.stdout),
        String::from_utf8_lossy(&said.stderr)
    );
}

/// Connect a send/recv pair on device `dev`, driving connect and accept alternately on one
/// thread (as NCCL's bootstrap does; any blocking would deadlock here).
pub fn pair(ctx: &CommContext, dev: i32) -> (Box<SendHandle>, Box<RecvHandle>) {
    pair_between(ctx, dev, dev)
}

/// A send/recv pair from device `from` (the sender) to device `to` (the receiver), connected as
/// [`pair`] does; both devices' link layers are checked and printed.
pub fn pair_between(ctx: &CommContext, from: i32, to: i32) -> (Box<SendHandle>, Box<RecvHandle>) {
    let mut handle = [0u8; 128];
    let mut l = api::listen(ctx, to, &mut handle).expect("listen");
    let (mut s, mut r) = (None, None);
    let end = Instant::now() + Duration::from_secs(30);
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = api::connect(ctx, from, &mut handle).expect("connect");
        }
        if r.is_none() {
            r = api::accept(&mut l).expect("accept");
        }
        assert!(Instant::now() < end, "connection setup did not finish");
    }
    let (s, r) = (s.expect("connected"), r.expect("accepted"));
    // SAFETY: s is a live SendHandle.
    assert_link_layer(unsafe { api::comm_device(&*s as *const SendHandle as *mut c_void) });
    if from != to {
        // SAFETY: r is a live RecvHandle.
        assert_link_layer(unsafe { api::comm_device(&*r as *const RecvHandle as *mut c_void) });
    }
    (s, r)
}

/// Register `buf` on the device of comm `h`.
pub fn reg<T>(h: &T, buf: &[u8]) -> Box<MemHandle> {
    // SAFETY: h is a live SendHandle/RecvHandle of the calling test.
    let dev = unsafe { api::comm_device(h as *const T as *mut c_void) }.clone();
    api::reg_mr(&dev, buf.as_ptr() as usize, buf.len(), MemKind::Host, None).expect("regMr")
}

/// One message of `size` bytes (filled with `fill`) from `s` to `r` under the profiler handles
/// `phandles` (send, receive; NULL for none): both requests must be reported done with `size`
/// and the bytes must arrive, within `within`. Err with the first error a call returned (its
/// kind is the `ncclResult_t` NCCL gets), or an internal error saying "a hang" when nothing
/// completed or failed in time.
pub fn transfer(
    s: &SendHandle,
    r: &RecvHandle,
    size: usize,
    fill: u8,
    phandles: (*mut c_void, *mut c_void),
    within: Duration,
) -> Result<(), Error> {
    let src = vec![fill; size.max(1)];
    let mut dst = vec![0u8; size.max(1)];
    let (smh, rmh) = (reg(s, &src), reg(r, &dst));
    let end = Instant::now() + within;
    let result = (|| {
        let rq = loop {
            // SAFETY: live handles; buffers registered and alive until both requests are done
            // or the comm failed.
            let q = unsafe {
                api::irecv_profiled(
                    r,
                    &[dst.as_mut_ptr() as usize],
                    &[size],
                    &[3],
                    &[&rmh],
                    false,
                    &[phandles.1],
                )
            };
            // None: no room now (a recovery, say); NCCL calls again.
            if let Some(q) = q? {
                break q;
            }
            if Instant::now() > end {
                return Err(Error::internal("irecv never took the receive (a hang)"));
            }
        };
        let sq = loop {
            // SAFETY: as above.
            let q = unsafe { api::isend_profiled(s, src.as_ptr() as usize, size, 3, &smh, phandles.0) };
            if let Some(q) = q? {
                break q;
            }
            if Instant::now() > end {
                return Err(Error::internal("isend never matched (a hang)"));
            }
        };
        for q in [sq, rq] {
            let mut sz = [0i32];
            // SAFETY: q is in flight until test says done or fails.
            while !unsafe { api::test(q, sz.as_mut_ptr()) }? {
                if Instant::now() > end {
                    return Err(Error::internal("no completion and no error within the bound (a hang)"));
                }
            }
            if sz[0] as usize != size {
                return Err(Error::internal(format!("reported {} bytes of {size}", sz[0])));
            }
        }
        if dst[..size] != src[..size] {
            return Err(Error::internal("the bytes differ"));
        }
        Ok(())
    })();
    api::dereg_mr(smh).expect("deregMr");
    api::dereg_mr(rmh).expect("deregMr");
    result
}

/// `count` messages from `s` to `r` of sizes cycling through `sizes`, each checked byte for
/// byte and by its reported size. As NCCL's proxy does, receives are posted up to `DEPTH`
/// ahead and every outstanding request is tested in turn on one thread (so both comms are
/// driven); a send goes to the oldest posted receive. `during` runs once after `after`
/// messages completed. The first error a call returns, or "a hang" past `within`.
pub fn stream(
    s: &SendHandle,
    r: &RecvHandle,
    count: usize,
    sizes: &[usize],
    after: usize,
    during: &mut dyn FnMut(),
    within: Duration,
) -> Result<usize, Error> {
    const DEPTH: usize = 4;
    let max = sizes.iter().copied().max().unwrap_or(1);
    let mut src: Vec<Vec<u8>> = (0..DEPTH).map(|_| vec![0u8; max]).collect();
    let mut dst: Vec<Vec<u8>> = (0..DEPTH).map(|_| vec![0u8; max]).collect();
    let smh: Vec<_> = src.iter().map(|b| reg(s, b)).collect();
    let rmh: Vec<_> = dst.iter().map(|b| reg(r, b)).collect();
    let end = Instant::now() + within;
    let size_of = |m: usize| sizes[m % sizes.len()];
    let byte = |m: usize, i: usize| (m * 131 + i * 7) as u8;
    // Message m uses receive slot m % DEPTH and send slot m % DEPTH.
    let mut recvs: Vec<Option<(usize, *mut api::Request)>> = vec![None; DEPTH];
    let mut sends: Vec<Option<(usize, *mut api::Request)>> = vec![None; DEPTH];
    let (mut next_recv, mut next_send, mut received, mut sent) = (0usize, 0usize, 0usize, 0usize);
    let mut fired = false;
    let result = (|| {
        while received < count || sent < count {
            if Instant::now() > end {
                return Err(Error::internal(format!(
                    "{received} received and {sent} sent of {count} within the bound (a hang)"
                )));
            }
            if !fired && received >= after {
                fired = true;
                during();
            }
            let k = next_recv % DEPTH;
            if next_recv < count && recvs[k].is_none() {
                let size = size_of(next_recv);
                dst[k][..size].fill(0);
                // SAFETY: live handle; the buffer is registered and outlives the request
                // (this function waits for it, or returns the error of a failed comm, after
                // which nothing more is written into it).
                let q = unsafe {
                    api::irecv_profiled(
                        r,
                        &[dst[k].as_mut_ptr() as usize],
                        &[size],
                        &[5],
                        &[&rmh[k]],
                        false,
                        &[std::ptr::null_mut()],
                    )
                }?;
                if let Some(q) = q {
                    recvs[k] = Some((next_recv, q));
                    next_recv += 1;
                }
            }
            let k = next_send % DEPTH;
            if next_send < next_recv && sends[k].is_none() {
                let size = size_of(next_send);
                for (i, b) in src[k][..size].iter_mut().enumerate() {
                    *b = byte(next_send, i);
                }
                // SAFETY: as above.
                let q = unsafe {
                    api::isend_profiled(s, src[k].as_ptr() as usize, size, 5, &smh[k], std::ptr::null_mut())
                }?;
                if let Some(q) = q {
                    sends[k] = Some((next_send, q));
                    next_send += 1;
                }
            }
            for k in 0..DEPTH {
                let mut sz = [0i32];
                if let Some((m, q)) = recvs[k] {
                    // SAFETY: in flight until test says done.
                    if unsafe { api::test(q, sz.as_mut_ptr()) }? {
                        let size = size_of(m);
                        if sz[0] as usize != size {
                            return Err(Error::internal(format!(
                                "message {m}: received {} of {size} bytes",
                                sz[0]
                            )));
                        }
                        if let Some(i) = (0..size).find(|&i| dst[k][i] != byte(m, i)) {
                            return Err(Error::internal(format!("message {m}: byte {i} of {size} differs")));
                        }
                        recvs[k] = None;
                        received += 1;
                    }
                }
                if let Some((m, q)) = sends[k] {
                    // SAFETY: as above.
                    if unsafe { api::test(q, sz.as_mut_ptr()) }? {
                        if sz[0] as usize != size_of(m) {
                            return Err(Error::internal(format!(
                                "message {m}: sent {} of {} bytes",
                                sz[0],
                                size_of(m)
                            )));
                        }
                        sends[k] = None;
                        sent += 1;
                    }
                }
            }
        }
        Ok(received)
    })();
    for mh in smh.into_iter().chain(rmh) {
        api::dereg_mr(mh).expect("deregMr");
    }
    result
}
