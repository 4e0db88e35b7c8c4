//! `softroce-ctl ADDR COMMAND`: inject a fault into the softroce device bound to ADDR in a
//! running process, as a real NIC or network fails (`port-down`, `port-up`, `gid-change`,
//! `blackhole PEER_ADDR`, `heal`, `status`, `device-fatal`, `qp-fatal QPN`, `qp-access-err QPN`,
//! `cq-overrun QPN`), or read its verbs work counters (`counters`: the process's totals and each
//! live QP's). It talks to the device's control socket
//! `${SOFTROCE_CTL_DIR:-/tmp/softroce}/ADDR.sock` and prints its answer; exit status 0 when the
//! device carried the command out. `softroce-ctl --print-variables` prints the table of
//! softroce's environment variables (`docs/softroce-variables.md`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() == 1 && args[0] == "--print-variables" {
        // docs/softroce-variables.md, from the declarations in softroce/src/config.rs.
        print!("{}", softroce::config::markdown_table());
        return;
    }
    if args.len() < 2 || args[0] == "-h" || args[0] == "--help" {
        eprintln!(
            "usage: softroce-ctl ADDR port-down | port-up | gid-change | blackhole PEER_ADDR | heal | status | counters\n\
             \x20                      | device-fatal | qp-fatal QPN | qp-access-err QPN | cq-overrun QPN\n\
             ADDR is the device's IPv4 address (SOFTROCE_ADDR of the process); sockets live in\n\
             ${{SOFTROCE_CTL_DIR:-/tmp/softroce}}\n\
             softroce-ctl --print-variables: the Markdown table of softroce's variables"
        );
        std::process::exit(2);
    }
    let Ok(addr) = args[0].parse::<std::net::Ipv4Addr>() else {
        eprintln!("softroce-ctl: `{}` is not an IPv4 address", args[0]);
        std::process::exit(2);
    };
    let path = softroce::driver::ctl::socket_path(addr);
    let mut s = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "softroce-ctl: no softroce device on {addr} ({}: {e}) — is the process running with SOFTROCE_ADDR={addr}, and the same SOFTROCE_CTL_DIR?",
                path.display()
            );
            std::process::exit(1);
        }
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let line = format!("{}\n", args[1..].join(" "));
    let mut reply = String::new();
    if let Err(e) = s
        .write_all(line.as_bytes())
        .and_then(|()| s.read_to_string(&mut reply).map(|_| ()))
    {
        eprintln!("softroce-ctl: {}: {e}", path.display());
        std::process::exit(1);
    }
    print!("{reply}");
    std::process::exit(if reply.starts_with("ok:") { 0 } else { 1 });
}
