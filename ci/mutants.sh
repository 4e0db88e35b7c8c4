#!/bin/bash
# The mutation campaign over the sans-IO cores (docs/mutation.md): cargo-mutants, one run per
# source file, each file's mutants tested against its package's unit tests and sans-IO
# simulations (never the softroce-backed or network tests). Not part of `make test`: hours on
# 2 cores. `make mutants` runs all of it.
#
#   ci/mutants.sh [MODULE-DIR-OR-FILE ...]
#       default: softroce/src/wire softroce/src/proto src/transport/proto
#
# The tree (less .git and target/) is copied to $MUTANTS_SCRATCH (default /tmp/mutants-src) and
# mutated there in place, one mutant at a time, so the work tree is never touched and every
# file's run reuses one incremental debug build (the copies are stamped now, -m, so cargo never
# takes a stale mutant's build for them). Results: $MUTANTS_OUT (default
# /tmp/mutants-out)/<file, / as __>/ with pass1/ and pass2/ (cargo-mutants' caught.txt,
# missed.txt, timeout.txt, unviable.txt, diff/, log/), and one line per file appended to
# $MUTANTS_OUT/scores.txt.
#
# Two passes per file, so that the simulations are built and run only where they can change
# the result: pass 1 tests every mutant against the unit tests alone (--lib); pass 2 tests the
# ones pass 1 did not catch or find unviable against the unit tests and the simulations. A
# mutant the unit tests catch is caught by the full set, so the score is the full set's:
# caught = caught in pass 1 + caught in pass 2; missed and timeout are pass 2's.
#
# Knobs: MUTANTS_OUT, MUTANTS_SCRATCH, MUTANTS_TIMEOUT (seconds per test run, default 300),
# MUTANTS_NICE (default 19), MUTANTS_PASS2_BASELINE (default run; skip: do not rerun the
# unmutated simulations before each file's pass 2 once they are known to pass). Needs `cargo install --locked cargo-mutants`.
set -u
cd "$(dirname "$0")/.." || exit 1
command -v cargo-mutants >/dev/null || { echo "cargo-mutants missing: cargo install --locked cargo-mutants"; exit 1; }
out=${MUTANTS_OUT:-/tmp/mutants-out}
scratch=${MUTANTS_SCRATCH:-/tmp/mutants-src}
timeout=${MUTANTS_TIMEOUT:-300}
nice_n=${MUTANTS_NICE:-19}
baseline2=${MUTANTS_PASS2_BASELINE:-run}
mkdir -p "$out" "$scratch"
tar --exclude=./.git --exclude=./target --exclude=./fuzz/target -cf - . | (cd "$scratch" && tar xmf -) || exit 1

# The simulations of each package: sans-IO, virtual time, no network, no softroce library.
sims_for() {
    case $1 in
    softroce/*) echo "--lib --test sim_transfer --test sim_errors --test sim_faults --test sim_chaos" ;;
    *) echo "--lib --test sim_transport --test sim_recovery --test sim_close" ;;
    esac
}
# Distinct lines: cargo-mutants lists every mutant of the plugin twice (the package is its own
# dev-dependency, for the `testing` feature) and tests both copies; a score counts it once.
count() { if [ -f "$1" ]; then sort -u "$1" | grep -c .; else echo 0; fi; }
# mutants TARGETS [OPTIONS]: cargo-mutants in the scratch tree, building and running only the
# test targets TARGETS (one word each, "--lib --test NAME ..."). They go as --cargo-arg, not
# after --: cargo-mutants passes the words after -- to the test run only, and its build step
# would build every test target of the package (softroce's verbs tests too) for each mutant.
mutants() {
    local t a=()
    for t in $1; do a+=("--cargo-arg=$t"); done
    shift
    (cd "$scratch" && nice -n "$nice_n" cargo mutants --in-place --workspace --timeout "$timeout" "${a[@]}" "$@")
}

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(softroce/src/wire softroce/src/proto src/transport/proto)
for t in "${targets[@]}"; do
    if [ -d "$t" ]; then mapfile -t files < <(find "$t" -name '*.rs' | sort); else files=("$t"); fi
    for f in "${files[@]}"; do
        n=$(cd "$scratch" && cargo mutants --list --workspace -f "$f" 2>/dev/null | sort -u | grep -c .)
        [ "$n" -gt 0 ] || continue
        dir=$out/${f//\//__}
        rm -rf "$dir"
        mkdir -p "$dir/pass1" "$dir/pass2"
        echo "== $f: $n mutants (pass 1 from $(date -u +%T))"
        mutants --lib -f "$f" -o "$dir/pass1" >"$dir/pass1.log" 2>&1
        p1=$dir/pass1/mutants.out
        p2=$dir/pass2/mutants.out
        # Pass 2: what pass 1 neither caught nor found unviable (missed, timeout).
        cat "$p1/missed.txt" "$p1/timeout.txt" 2>/dev/null >"$dir/retest.txt"
        if [ -s "$dir/retest.txt" ]; then
            echo "   pass 2: $(count "$dir/retest.txt") against the simulations too ($(date -u +%T))"
            # Exact names as regexes: escape every metacharacter.
            mapfile -t res < <(sed 's/[][\\.^$*+?(){}|]/\\&/g; s/^/^/; s/$/$/' "$dir/retest.txt")
            args=()
            for r in "${res[@]}"; do args+=(-F "$r"); done
            mutants "$(sims_for "$f")" --baseline "$baseline2" -f "$f" "${args[@]}" -o "$dir/pass2" >"$dir/pass2.log" 2>&1
        fi
        line="$f: $n mutants, caught $(($(count "$p1/caught.txt") + $(count "$p2/caught.txt"))), missed $(count "$p2/missed.txt"), timeout $(count "$p2/timeout.txt"), unviable $(count "$p1/unviable.txt")"
        echo "$line" | tee -a "$out/scores.txt"
    done
done
