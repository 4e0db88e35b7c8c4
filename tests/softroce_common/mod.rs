//! What the softroce-backed child-process tests share: a connected pair on a device, a
//! registration, and one checked transfer through the API as NCCL drives it.
#![allow(dead_code)]

use nccl_net_ferroce::api::{self, CommContext, RecvHandle, SendHandle};
use nccl_net_ferroce::error::Error;
use nccl_net_ferroce::transport::{MemHandle, MemKind};
use std::ffi::c_void;
use std::process::Command;
use std::time::{Duration, Instant};

/// The softroce libibverbs the plugin loads in these tests: FERROCE_TEST_SOFTROCE_LIB when set
/// (ci/tests/80-sanitizers.sh points it at a ThreadSanitizer build of softroce), else the one
/// `softroce/build.sh` made.
pub fn softroce_lib() -> String {
    std::env::var("FERROCE_TEST_SOFTROCE_LIB")
        .unwrap_or_else(|_| format!("{}/target/release/softroce/libibverbs.so.1", env!("CARGO_MANIFEST_DIR")))
}

/// Connect a send/recv pair on device `dev`, driving connect and accept alternately on one
/// thread (as NCCL's bootstrap does; any blocking would deadlock here).
pub fn pair(ctx: &CommContext, dev: i32) -> (Box<SendHandle>, Box<RecvHandle>) {
    let mut handle = [0u8; 128];
    let mut l = api::listen(ctx, dev, &mut handle).expect("listen");
    let (mut s, mut r) = (None, None);
    let end = Instant::now() + Duration::from_secs(30);
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = api::connect(ctx, dev, &mut handle).expect("connect");
        }
        if r.is_none() {
            r = api::accept(&mut l).expect("accept");
        }
        assert!(Instant::now() < end, "connection setup did not finish");
    }
    (s.expect("connected"), r.expect("accepted"))
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
        // SAFETY: live handles; buffers registered and alive until both requests are done or
        // the comm failed.
        let rq = unsafe {
            api::irecv_profiled(
                r,
                &[dst.as_mut_ptr() as usize],
                &[size],
                &[3],
                &[&rmh],
                false,
                &[phandles.1],
            )
        }?
        .ok_or_else(|| Error::internal("no receive slot"))?;
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

/// Runs the `#[ignore]`d test `child` of this test binary as a child process (`{tag}_CHILD=1`,
/// softroce as the plugin's libibverbs, its own fault-control directory, the side channel on
/// lo, short transport and setup timeouts) with `env` on top; its stdout and stderr, after
/// checking that it passed and printed "`child`: done".
pub fn run_child(tag: &str, child: &str, env: &[(&str, &str)]) -> String {
    let dir = std::env::temp_dir().join(format!("ferroce-{tag}-{child}-{}", std::process::id()));
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([child, "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(format!("{tag}_CHILD"), "1")
        .env("NCCL_IBVERBS_LIB", softroce_lib())
        .env("SOFTROCE_CTL_DIR", &dir)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_IB_TIMEOUT", "12")
        .env("FERROCE_CONNECT_TIMEOUT_SEC", "10")
        .envs(env.iter().copied())
        .output()
        .expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains(&format!("{child}: done")),
        "the child did not run:\n{text}"
    );
    text
}
