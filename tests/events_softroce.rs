//! Asynchronous events attributed to the port and the comms that use it (issue 11 item 2), with
//! softroce's fault control: two softroce devices in one process, a connection on each; the port
//! of one goes down (softroce-ctl port-down). Only the comm on that port fails, with the plugin's
//! WARN in words; the other comm goes on. Runs in a child process (its own devices, stderr
//! captured), with FERROCE_TEST_SOFTROCE=1 after `make build`. Addresses 127.0.44.x.

mod softroce_common;

use nccl_net_ferroce::api;
use softroce_common::{pair, transfer};
use std::process::Command;
use std::time::Duration;

fn root() -> &'static str {
    env!("CARGO_MANIFEST_DIR")
}

#[test]
fn a_port_down_fails_only_the_comms_on_that_port() {
    if std::env::var("FERROCE_TEST_SOFTROCE").ok().as_deref() != Some("1") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferroce-events-{}", std::process::id()));
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["port_down_child", "--exact", "--nocapture", "--test-threads", "1"])
        .env("EVENTS_CHILD", "1")
        .env(
            "NCCL_IBVERBS_LIB",
            format!("{}/target/release/softroce/libibverbs.so.1", root()),
        )
        .env("SOFTROCE_DEVICES", "2")
        .env("SOFTROCE_ADDR", "127.0.44.1,127.0.44.2")
        .env("SOFTROCE_CTL_DIR", &dir)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_IB_TIMEOUT", "12")
        .env("NCCL_IB_RETRY_CNT", "2")
        .env("FERROCE_CONNECT_TIMEOUT_SEC", "10")
        .output()
        .expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("port_down_child: done"), "the child did not run:\n{text}");
    let warns: Vec<&str> = text.lines().filter(|l| l.contains("the port went down")).collect();
    assert_eq!(warns.len(), 1, "one WARN for the one event: {warns:#?}\n{text}");
    assert!(
        warns[0].contains("device softroce0 port 1") && warns[0].contains("the device's other ports go on"),
        "{}",
        warns[0]
    );
}

/// No profiler handles.
const NONE: (*mut std::ffi::c_void, *mut std::ffi::c_void) = (std::ptr::null_mut(), std::ptr::null_mut());

#[test]
fn port_down_child() {
    if std::env::var("EVENTS_CHILD").ok().as_deref() != Some("1") {
        return;
    }
    let ctx = api::init(None, -1, false).expect("init");
    let (s0, r0) = pair(&ctx, 0);
    let (s1, r1) = pair(&ctx, 1);
    transfer(&s0, &r0, 64 * 1024, 7, NONE, Duration::from_secs(10)).expect("softroce0 before");
    transfer(&s1, &r1, 64 * 1024, 7, NONE, Duration::from_secs(10)).expect("softroce1 before");
    let ctl = format!("{}/target/release/softroce/softroce-ctl", root());
    let said = Command::new(&ctl)
        .args(["127.0.44.1", "port-down"])
        .output()
        .expect("softroce-ctl");
    assert!(
        said.status.success(),
        "softroce-ctl: {}",
        String::from_utf8_lossy(&said.stdout)
    );
    // The comm on the downed port fails (its liveness probe sees the port's event, or its
    // retries run out), within a bound, never a hang.
    let err =
        transfer(&s0, &r0, 64 * 1024, 7, NONE, Duration::from_secs(20)).expect_err("the comm on the downed port fails");
    assert!(!err.contains("a hang"), "{err}");
    // The comm on the other device's port goes on.
    for _ in 0..5 {
        transfer(&s1, &r1, 64 * 1024, 7, NONE, Duration::from_secs(10))
            .expect("softroce1 after softroce0's port went down");
    }
    drop((s0, r0, s1, r1));
    api::finalize(ctx).expect("finalize");
    println!("port_down_child: done");
}
