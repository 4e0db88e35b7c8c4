//! The transport's real verbs path over softroce, through the internal API, in one process.
//!
//! Runs only with `FERROCE_TEST_SOFTROCE=1` (and `target/release/softroce/libibverbs.so.1`
//! built: `softroce/build.sh`); otherwise every test prints why it skipped. Each test binary
//! is one process, so the environment (softroce address, side-channel interface, library
//! path) is set once before the plugin reads its configuration.

use nccl_net_ferroce::api::{self, CommContext, RecvHandle, SendHandle};
use nccl_net_ferroce::transport::{MemHandle, Request};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

static SETUP: Once = Once::new();
static LOCK: Mutex<()> = Mutex::new(());

fn softroce_lib() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    format!("{root}/target/release/softroce/libibverbs.so.1")
}

/// The API context, or None (skip) when softroce tests are not enabled.
fn setup() -> Option<Box<CommContext>> {
    if std::env::var("FERROCE_TEST_SOFTROCE").ok().as_deref() != Some("1") {
        eprintln!("skipped: set FERROCE_TEST_SOFTROCE=1 (after softroce/build.sh) to run the softroce transport tests");
        return None;
    }
    SETUP.call_once(|| {
        let lib = softroce_lib();
        assert!(
            std::path::Path::new(&lib).exists(),
            "{lib} missing: run softroce/build.sh"
        );
        std::env::set_var("NCCL_IBVERBS_LIB", &lib);
        if std::env::var("SOFTROCE_ADDR").is_err() {
            std::env::set_var("SOFTROCE_ADDR", "127.0.41.1");
        }
        if std::env::var("NCCL_SOCKET_IFNAME").is_err() {
            std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        }
        if std::env::var("FERROCE_CONNECT_TIMEOUT_SEC").is_err() {
            std::env::set_var("FERROCE_CONNECT_TIMEOUT_SEC", "5");
        }
    });
    Some(api::init(None, -1, false).expect("init over softroce"))
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// Connect a send/recv pair on device 0, driving connect and accept alternately on one thread
/// (as NCCL's bootstrap does; any blocking would deadlock here).
fn pair(ctx: &CommContext) -> (Box<SendHandle>, Box<RecvHandle>) {
    let mut handle = [0u8; 128];
    let mut l = api::listen(ctx, 0, &mut handle).expect("listen");
    let (mut s, mut r) = (None, None);
    let end = deadline();
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = api::connect(ctx, 0, &mut handle).expect("connect");
        }
        if r.is_none() {
            r = api::accept(&mut l).expect("accept");
        }
        assert!(Instant::now() < end, "connection setup did not finish");
    }
    drop(l);
    (s.unwrap(), r.unwrap())
}

fn device_of<T>(h: &T) -> Arc<nccl_net_ferroce::device::VirtualDevice> {
    // SAFETY: h is a live SendHandle/RecvHandle.
    unsafe { api::comm_device(h as *const T as *mut std::ffi::c_void) }.clone()
}

fn reg<T>(h: &T, buf: &[u8]) -> Box<MemHandle> {
    api::reg_mr(&device_of(h), buf.as_ptr() as usize, buf.len(), 1, None).expect("regMr")
}

fn wait(req: *mut Request, sizes: &mut [i32]) {
    let end = deadline();
    loop {
        // SAFETY: req is live until reported done.
        if unsafe { api::test(req, sizes.as_mut_ptr()) }.expect("test") {
            return;
        }
        assert!(Instant::now() < end, "request did not complete");
    }
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// Send `size` bytes from s to r (receive buffer `cap` ≥ size) and verify every byte.
fn transfer(s: &SendHandle, r: &RecvHandle, size: usize, cap: usize, seed: u64) {
    let mut src = vec![0u8; size.max(1)];
    fill(&mut src, seed);
    let mut dst = vec![0xeeu8; cap.max(1)];
    let (smh, rmh) = (reg(s, &src), reg(r, &dst));
    // SAFETY: handles live; buffers registered and alive until completion.
    let rreq = loop {
        if let Some(q) = unsafe { api::irecv(r, &[dst.as_mut_ptr() as usize], &[cap], &[7], &[&rmh], false) }.unwrap() {
            break q;
        }
    };
    let end = deadline();
    let sreq = loop {
        // SAFETY: as above.
        if let Some(q) = unsafe { api::isend(s, src.as_ptr() as usize, size, 7, &smh) }.unwrap() {
            break q;
        }
        assert!(Instant::now() < end, "isend never matched");
    };
    let mut ss = [-1i32];
    let mut rs = [-1i32];
    wait(sreq, &mut ss);
    wait(rreq, &mut rs);
    assert_eq!(ss[0] as usize, size);
    assert_eq!(rs[0] as usize, size, "receiver reports the real size");
    assert!(dst[..size] == src[..size], "payload of {size} bytes differs");
    assert!(
        dst[size..cap].iter().all(|&b| b == 0xee),
        "bytes past the message were written"
    );
    api::dereg_mr(smh).unwrap();
    api::dereg_mr(rmh).unwrap();
}

#[test]
fn connect_and_transfer_sizes() {
    let Some(ctx) = setup() else { return };
    let _g = LOCK.lock().unwrap();
    let (s, r) = pair(&ctx);
    for (i, &size) in [0usize, 1, 127, 128, 129, 4095, 4096, 65_537, 1 << 20, (4 << 20) + 3]
        .iter()
        .enumerate()
    {
        transfer(&s, &r, size, size + 4096, i as u64 + 1);
    }
    drop(s);
    drop(r);
    api::finalize(ctx).unwrap();
}
