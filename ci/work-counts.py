#!/usr/bin/env python3
"""The harness's `--stats` verbs-work lines (`#work bytes=... rank=... key=value ...`, see
nccl-tests-harness/common.c h_work_report), read back.

  work-counts.py table   NAME FILE   one line per size and rank: the counts per message
  work-counts.py targets NAME FILE   the verbs-work targets, one PASS/FAIL line each with its figure:
                                     <= 1 post call per QP a message uses (the sender's data
                                     posts, the receiver's receive posts), <= 1 signaled
                                     completion per QP per send, <= 1 CTS write per irecv
  work-counts.py check   NAME FILE   consistency (make test): every size has softroce and plugin
                                     figures; softroce's post calls are exactly the plugin's; WRs
                                     >= post calls >= 1 per message; receives posted in batches of
                                     RQ_BATCH (16) per QP, never more often (the eager QP a batch
                                     ahead); packets >= WRs, more than
                                     one per MTU of a rank's average isend; with 1 QP per
                                     connection: exactly one signaled completion per send; at most
                                     one CTS write per irecv (receives posted back to back share one)
QPS (environment, default 1) is NCCL_IB_QPS_PER_CONNECTION of the run; MTU (default 4096) the
path MTU. Exit status 1 when a check fails, or (targets) when a figure is missing.
"""
import os
import re
import sys

QPS = int(os.environ.get("QPS", "1"))
# Receives a receiver posts per ibv_post_recv (src/transport/proto/recv.rs RQ_BATCH).
RQ_BATCH = 16
MTU = int(os.environ.get("MTU", "4096"))


def rows(path):
    out = []
    for line in open(path):
        if not line.startswith("#work "):
            continue
        kv = dict(re.findall(r"(\w+)=([-\w.]+)", line))
        r = {k: float(v) for k, v in kv.items() if re.fullmatch(r"-?[0-9.]+", v)}
        r["softroce"] = "softroce" not in kv  # "softroce=absent" when there are no counters
        r["plugin"] = "plugin" not in kv
        out.append(r)
    return out


def fmt(v):
    return f"{v:.3f}".rstrip("0").rstrip(".") if v == v else "n/a"


def table(name, rs):
    print(f"# {name}: verbs work per message (softroce: both roles of a rank; send_/recv_/cts: the plugin, per isend / irecv)")
    print(f"#   {'bytes':>9} rank  post_send  post_recv    wrs  signaled  polls  empty  packets  retx   send_posts  send_signaled  recv_posts   cts  eager")
    for r in rs:
        g = lambda k: fmt(r.get(k, float("nan")))
        print(
            f"#   {int(r['bytes']):>9} {int(r['rank']):>4}  {g('post_send'):>9}  {g('post_recv'):>9} {g('wrs'):>6}  {g('signaled'):>8}"
            f" {g('polls'):>6} {g('empty_polls'):>6}  {g('packets'):>7} {g('retransmits'):>5}   {g('send_posts'):>10}"
            f"  {g('send_signaled'):>13}  {g('recv_posts'):>10} {g('cts'):>5} {g('eager'):>6}"
        )


def targets(name, rs):
    """One line per target and size (worst rank), PASS or FAIL with the figure."""
    missing = 0
    for size in sorted({int(r["bytes"]) for r in rs}):
        at = [r for r in rs if int(r["bytes"]) == size and r["plugin"]]
        if not at:
            print(f"{name} {size} B: FAIL no plugin figures (FERROCE_STATS unset, or not ferroce)")
            missing += 1
            continue
        for what, key, limit in (
            ("sender post calls per isend per QP", "send_posts", 1.0),
            ("receiver receive posts per irecv per QP", "recv_only_posts", 1.0),
            ("signaled completions per isend per QP", "send_signaled", 1.0),
            ("CTS writes per irecv", "cts", None),
        ):
            worst = max(receive_posts(r) if key == "recv_only_posts" else r[key] for r in at)
            per = worst if limit is None else worst / QPS
            ok = per <= 1.0 + 1e-9
            print(f"{name} {size:>8} B: {'PASS' if ok else 'FAIL'} {what}: {per:.3f} (target <= 1)")
    return missing == 0


def receive_posts(r):
    """The receiver's ibv_post_recv calls per irecv: its posts less its CTS writes."""
    return r["recv_posts"] - r["cts"]


def check(name, rs):
    bad = []
    if not rs:
        bad.append("no #work lines (was --stats given?)")
    for r in rs:
        where = f"{int(r['bytes'])} B rank {int(r['rank'])}"
        if not (r["softroce"] and r["plugin"]):
            bad.append(f"{where}: figures missing (softroce {r['softroce']}, plugin {r['plugin']})")
            continue
        m, ns, nr = r["msgs"], r["isends"], r["irecvs"]
        if m < 1:
            bad.append(f"{where}: no messages counted")
            continue
        # softroce counts every post of the process; the plugin is its only user here.
        sr_posts = (r["post_send"] + r["post_recv"]) * m
        pl_posts = r["send_posts"] * ns + r["recv_posts"] * nr
        if abs(sr_posts - pl_posts) > 0.01 * m:
            bad.append(f"{where}: softroce saw {sr_posts:.1f} post calls, the plugin made {pl_posts:.1f}")
        if not r["wrs"] >= r["post_send"] >= 1:
            bad.append(f"{where}: want WRs >= post_send calls >= 1 per message, got {r['wrs']} and {r['post_send']}")
        # receives go RQ_BATCH per post and only when a QP has none to spare: over nr irecvs
        # at most one post per RQ_BATCH receives per QP, plus the batch already started, and one
        # more on the eager QP, which keeps a receive to spare for each eager message in flight
        most = (nr * QPS) // RQ_BATCH + QPS + 1
        if r["post_recv"] * m > most + 0.01 * m:
            bad.append(f"{where}: {r['post_recv'] * m:.1f} receive posts for {nr:.0f} irecvs (at most {most})")
        if r["packets"] < r["wrs"]:
            bad.append(f"{where}: {r['packets']} packets per message for {r['wrs']} WRs")
        # a rank's data requests alone (its isends' bytes / MTU) bound its request packets
        need = r["msg_bytes"] / MTU * ns / m
        if r["msg_bytes"] > MTU and r["packets"] - r["responses"] < need:
            bad.append(f"{where}: {r['packets'] - r['responses']} request packets per message of {int(r['msg_bytes'])} B (MTU {MTU})")
        if r["polls"] < r["cqes"] or r["empty_polls"] > r["polls"]:
            bad.append(f"{where}: polls {r['polls']}, empty {r['empty_polls']}, CQEs {r['cqes']}")
        if QPS == 1 and abs(r["send_signaled"] - 1.0) > 1e-9:
            bad.append(f"{where}: send_signaled = {r['send_signaled']}, the protocol fixes 1 with 1 QP per connection")
        # A CTS write per irecv at most: receives posted back to back share one.
        if not 0 < r["cts"] <= 1.0 + 1e-9:
            bad.append(f"{where}: cts = {r['cts']} per irecv, want more than 0 and at most 1")
    for b in bad:
        print(f"{name}: {b}")
    if not bad:
        print(f"{name}: {len(rs)} rows ({len({r['bytes'] for r in rs})} sizes) consistent")
    return not bad


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("table", "targets", "check"):
        sys.exit(__doc__)
    mode, name, path = sys.argv[1:]
    rs = rows(path)
    if mode == "table":
        table(name, rs)
        sys.exit(0 if rs else 1)
    sys.exit(0 if {"targets": targets, "check": check}[mode](name, rs) else 1)


if __name__ == "__main__":
    main()
