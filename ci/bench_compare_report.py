#!/usr/bin/env python3
"""The tables of ci/bench-compare.sh from its run folder.

    bench_compare_report.py RUN_DIR ROUNDS BASELINE "COLLECTIVES" "SIZES" JSON_OUT

RUN_DIR holds one harness output per run, named TAG.COLL.SIZE.ROUND (TAG ferroce|base), plus
TAG.pingpong.ROUND and TAG.scale. Ratios are paired per round and summarised as the median over
rounds with a 95 % bootstrap interval (rounds resampled with replacement, a fixed seed so the same
runs give the same interval). Exits 1 on a run with wrong results or a missing figure.
"""
import json
import math
import os
import random
import re
import statistics
import sys

BOOTSTRAP_SAMPLES = 4000
WORK_KEYS = ("wrs", "signaled", "polls", "packets")


def nccl_rows(text):
    """(bytes, time_us, wrong) of each nccl-tests-style result row."""
    rows = []
    for line in text.splitlines():
        c = line.split()
        if len(c) >= 9 and c[0].isdigit() and c[1].isdigit():
            rows.append((int(c[0]), float(c[5]), c[8]))
    return rows


def key_values(line):
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def parse_run(path):
    """One run: its time (us), CPU per message (us), per-call times (us) and verbs work."""
    text = open(path, errors="replace").read()
    rows = nccl_rows(text)
    if not rows:
        raise ValueError(f"{os.path.basename(path)}: no result row")
    size, time_us, wrong = rows[-1]
    if wrong not in ("0", "N/A"):
        raise ValueError(f"{os.path.basename(path)}: #wrong {wrong} at {size} bytes")
    run = {"time_us": time_us}
    cpu = [key_values(l) for l in text.splitlines() if l.startswith("#cpu ")]
    if cpu:
        per_msg = [float(c["process_cpu_s"]) / max(float(c["sends"]), float(c["recvs"]), 1.0) for c in cpu]
        run["cpu_us_per_msg"] = 1e6 * statistics.mean(per_msg)

        def per_call(time_key, calls_key):
            calls = sum(float(c[calls_key]) for c in cpu)
            return 1e6 * sum(float(c[time_key]) for c in cpu) / calls if calls else float("nan")

        run["isend_us_per_call"] = per_call("isend_s", "isend_calls")
        run["irecv_us_per_call"] = per_call("irecv_s", "irecv_calls")
        run["test_us_per_call"] = per_call("test_s", "tests")
    work = [key_values(l) for l in text.splitlines() if l.startswith("#work ") and " rank=0 " in l]
    if work and "wrs" in work[-1]:
        run["work"] = {k: float(work[-1][k]) for k in WORK_KEYS}
    # Request packets sent again per message: each rank process's softroce counter (every QP of
    # the process, both roles), averaged over the ranks. Whole messages resent by a probe or a
    # timeout show here (a 256 KiB message is 64 packets), rarely in a median: reported as means.
    retx = [float(kv["retransmits"]) for kv in (key_values(l) for l in text.splitlines() if l.startswith("#work "))
            if "retransmits" in kv]
    if retx:
        run["retransmits_per_msg"] = statistics.mean(retx)
    return run


def median(values):
    return statistics.median(values) if values else float("nan")


def bootstrap(values, rng):
    """95 % interval of the median of `values`, resampling them with replacement."""
    if len(values) < 2:
        return (float("nan"), float("nan"))
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP_SAMPLES))
    return (meds[int(0.025 * len(meds))], meds[int(0.975 * len(meds)) - 1])


def fmt_ci(mid, lo, hi):
    if math.isnan(lo):
        return f"{mid:6.3f} [  n/a ]"
    return f"{mid:6.3f} [{lo:.3f}, {hi:.3f}]"


def runs_of(d, name, rounds):
    """{round: (ferroce run, baseline run)} for rounds where both runs exist and parse."""
    pairs = {}
    for r in range(1, rounds + 1):
        a, b = f"{d}/ferroce.{name}.{r}", f"{d}/base.{name}.{r}"
        if os.path.exists(a) and os.path.exists(b):
            pairs[r] = (parse_run(a), parse_run(b))
    return pairs


def compare(d, rounds, colls, sizes, rng, report):
    for coll in colls:
        print(f"\n# {coll}_perf, 2 ranks: medians over rounds; speed = baseline time / ferroce time (> 1: ferroce faster);")
        print("#   cpu ratio = baseline CPU per message / ferroce's (> 1: ferroce cheaper), CPU of each whole rank")
        print("#   process; [95 % bootstrap interval over rounds]; per-call us = inside isend / irecv / test")
        print(f"{'size':>6} {'ferroce us':>10} {'base us':>9}  {'speed [95% CI]':<24} {'cpu/msg us':>10} {'base':>8}  "
              f"{'cpu ratio [95% CI]':<24} {'ferroce isend/irecv/test':>25} {'base isend/irecv/test':>22}  "
              f"{'work/msg wrs,signaled,polls,packets (medians),retransmits (mean): ferroce | base'}")
        for s in sizes:
            pairs = runs_of(d, f"{coll}.{s}", rounds)
            if not pairs:
                raise ValueError(f"{coll} {s}: no round with both plugins' runs")
            fa = [p[0] for p in pairs.values()]
            ba = [p[1] for p in pairs.values()]
            speed = [b["time_us"] / a["time_us"] for a, b in zip(fa, ba)]
            row = {
                "collective": coll, "size": s, "rounds": len(pairs),
                "ferroce_time_us": median([x["time_us"] for x in fa]),
                "baseline_time_us": median([x["time_us"] for x in ba]),
                "speed": median(speed), "speed_ci95": bootstrap(speed, rng),
                "per_round": [{k: x[k] for k in ("time_us", "cpu_us_per_msg") if k in x} | {"who": who}
                              for a, b in zip(fa, ba) for who, x in (("ferroce", a), ("baseline", b))],
            }
            have_cpu = all("cpu_us_per_msg" in x for x in fa + ba)
            if have_cpu:
                cpu = [b["cpu_us_per_msg"] / a["cpu_us_per_msg"] for a, b in zip(fa, ba) if a["cpu_us_per_msg"] > 0]
                row.update({
                    "ferroce_cpu_us_per_msg": median([x["cpu_us_per_msg"] for x in fa]),
                    "baseline_cpu_us_per_msg": median([x["cpu_us_per_msg"] for x in ba]),
                    "cpu_ratio": median(cpu), "cpu_ratio_ci95": bootstrap(cpu, rng),
                })
                for who, runs in (("ferroce", fa), ("baseline", ba)):
                    for k in ("isend", "irecv", "test"):
                        row[f"{who}_{k}_us_per_call"] = median([x[f"{k}_us_per_call"] for x in runs])
            for who, runs in (("ferroce", fa), ("baseline", ba)):
                work = [x["work"] for x in runs if "work" in x]
                if work:
                    row[f"{who}_work_per_msg"] = {k: median([w[k] for w in work]) for k in WORK_KEYS}
                retx = [x["retransmits_per_msg"] for x in runs if "retransmits_per_msg" in x]
                if retx:
                    row[f"{who}_retransmits_per_msg"] = statistics.mean(retx)
            report["rows"].append(row)

            def calls(who):
                if not have_cpu:
                    return "n/a"
                return "/".join(f"{row[f'{who}_{k}_us_per_call']:.2f}" for k in ("isend", "irecv", "test"))

            def work(who):
                w = row.get(f"{who}_work_per_msg")
                r = row.get(f"{who}_retransmits_per_msg")
                if not w:
                    return "absent"
                return ",".join(f"{w[k]:.2f}" for k in WORK_KEYS) + (f",{r:.3f}" if r is not None else ",n/a")

            cpu_cols = (f"{row['ferroce_cpu_us_per_msg']:>10.2f} {row['baseline_cpu_us_per_msg']:>8.2f}  "
                        f"{fmt_ci(row['cpu_ratio'], *row['cpu_ratio_ci95']):<24}") if have_cpu else f"{'n/a':>10} {'n/a':>8}  {'':<24}"
            print(f"{s:>6} {row['ferroce_time_us']:>10.2f} {row['baseline_time_us']:>9.2f}  "
                  f"{fmt_ci(row['speed'], *row['speed_ci95']):<24} {cpu_cols} {calls('ferroce'):>25} {calls('baseline'):>22}  "
                  f"{work('ferroce')} | {work('baseline')}")


def main():
    d, rounds, base, colls, sizes, json_out = sys.argv[1:7]
    rounds = int(rounds)
    rng = random.Random(20261205)
    report = {"baseline": os.path.basename(base), "rounds": rounds, "rows": []}
    print(f"# ferroce against {os.path.basename(base)}, {rounds} interleaved rounds")
    try:
        compare(d, rounds, colls.split(), sizes.split(), rng, report)
        pp = runs_of(d, "pingpong", rounds)
        if not pp:
            raise ValueError("ping-pong: no round with both plugins' runs")
        lat = [b["time_us"] / a["time_us"] for a, b in pp.values()]
        report["pingpong_8B"] = {
            "ferroce_us": median([a["time_us"] for a, _ in pp.values()]),
            "baseline_us": median([b["time_us"] for _, b in pp.values()]),
            "speed": median(lat), "speed_ci95": bootstrap(lat, rng),
        }
        p = report["pingpong_8B"]
        print(f"\nping-pong 8 B half RTT us   {p['ferroce_us']:>8.2f} {p['baseline_us']:>8.2f} speed {fmt_ci(p['speed'], *p['speed_ci95'])}")
    except ValueError as e:
        print(f"bench-compare: {e}", file=sys.stderr)
        sys.exit(1)

    def heap(tag):
        m = re.search(r"heap_per_conn_KiB=([0-9.]+)", open(f"{d}/{tag}.scale", errors="replace").read())
        return float(m.group(1)) if m else float("nan")

    h_a, h_b = heap("ferroce"), heap("base")
    report["heap_per_conn_KiB"] = {"ferroce": h_a, "baseline": h_b}
    print(f"heap per connection KiB     {h_a:>8.1f} {h_b:>8.1f} ratio {h_a / h_b if h_b else float('nan'):.3f}")
    with open(json_out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
