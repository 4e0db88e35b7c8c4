#!/bin/bash
# The documentation holds together:
#
#   * ci/check-links.py: every relative link and #anchor of README.md, CHANGELOG.md and
#     docs/**.md resolves, and every docs/…md#anchor the code cites;
#   * README.md is at most 200 lines (the rest lives in docs/);
#   * README.md, CHANGELOG.md and docs/ stand alone: no path into ../shared and no "issue N";
#   * the newest release in CHANGELOG.md is the version of ferroce, softroce and ferroce-doctor.
#
# Each check first runs on a planted tree that breaks it (it must fail, naming file:line), then
# on the repository. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/../.." || exit 1
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAILED: $1"; }
command -v python3 >/dev/null || { echo "FAILED: python3 missing (ci/install-deps.sh)"; echo "docs: 0 passed, 1 failed"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# README.md at most 200 lines; prints the offence.
readme_short() {
    n=$(wc -l <"$1/README.md")
    [ "$n" -le 200 ] || { echo "$1/README.md: $n lines, at most 200"; return 1; }
}

# No reference to ../shared or an issue number in README.md, CHANGELOG.md and docs/.
stands_alone() {
    (
        cd "$1" || exit 1
        mapfile -t files < <(ls README.md CHANGELOG.md 2>/dev/null; find docs -name '*.md' 2>/dev/null)
        [ "${#files[@]}" -gt 0 ] || exit 0
        ! grep -nHiE '\.\./shared|shared/spec|\bissues? #?[0-9]+|\(#[0-9]+\)' "${files[@]}"
    )
}

# The newest "## [X.Y.Z]" of CHANGELOG.md is every crate's version.
versions_agree() {
    top=$(sed -n 's/^## \[\([0-9][0-9.]*\)\].*/\1/p' "$1/CHANGELOG.md" | head -n 1)
    [ -n "$top" ] || { echo "$1/CHANGELOG.md: no '## [X.Y.Z]' release"; return 1; }
    for t in Cargo.toml softroce/Cargo.toml doctor/Cargo.toml; do
        v=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$1/$t" | head -n 1)
        [ "$v" = "$top" ] || { echo "$1/$t: version $v, CHANGELOG.md's newest release is $top"; return 1; }
    done
}

# A planted tree: one broken link, one broken anchor, one broken code citation, a long README,
# a reference to ../shared and an issue number, versions that disagree.
# (The planted paths are spelt through $D so that the check of this script's own citations does
# not see them.)
D=docs
p=$tmp/planted
mkdir -p "$p/docs/design" "$p/src" "$p/softroce" "$p/doctor"
{
    echo "# planted"
    echo "See [the guide]($D/guide.md#setup) and [the design]($D/design/missing.md)."
    echo "The spec in ../shared/spec/x.md, as issue 13 asked."
    echo '```'
    echo '[inside a code block](not-checked.md)'
    echo '```'
    for i in $(seq 1 200); do echo "line $i"; done
} >"$p/README.md"
printf '# Guide\n\n## Set-up\n\n[back](../README.md#planted) [ok](#set-up)\n' >"$p/$D/guide.md"
printf '## [0.3.0] - 2026-12-24\n' >"$p/CHANGELOG.md"
printf '// see %s/guide.md#teardown and %s/guide.md#set-up\n' $D $D >"$p/src/lib.rs"
for t in Cargo.toml softroce/Cargo.toml doctor/Cargo.toml; do printf '[package]\nversion = "0.2.0"\n' >"$p/$t"; done

out=$(python3 ci/check-links.py --root "$p" 2>&1)
while IFS= read -r line; do echo "  planted: $line"; done <<<"$out"
if echo "$out" | grep -q "^README.md:2: '$D/guide.md#setup': no heading" &&
    echo "$out" | grep -q "^README.md:2: '$D/design/missing.md': no such file" &&
    echo "$out" | grep -q "^src/lib.rs:1: '$D/guide.md#teardown'" &&
    ! echo "$out" | grep -q "not-checked\|#set-up\|#planted\|README.md:3:" &&
    ! python3 ci/check-links.py --root "$p" >/dev/null 2>&1; then
    ok "check-links fails on a planted broken link, anchor and code citation (and only on them)"
else
    bad "check-links did not report exactly the planted broken link, anchor and citation"
fi
if readme_short "$p" >/dev/null; then bad "a 206-line README passed the length check"; else ok "length check fails on a 206-line README"; fi
s=$(stands_alone "$p")
if echo "$s" | grep -q "README.md:3:"; then ok "stand-alone check fails on ../shared and 'issue 13'"; else bad "stand-alone check missed README.md:3"; fi
if versions_agree "$p" >/dev/null; then bad "versions 0.2.0 against CHANGELOG 0.3.0 passed"; else ok "version check fails when CHANGELOG and Cargo.toml disagree"; fi

# The repository.
if python3 ci/check-links.py; then ok "every link, anchor and docs/ citation resolves"; else bad "broken links (above)"; fi
if readme_short .; then ok "README.md is $(wc -l <README.md) lines"; else bad "README.md too long"; fi
if stands_alone .; then ok "README, CHANGELOG and docs/ name no ../shared and no issue numbers"; else bad "references to ../shared or issue numbers (above)"; fi
if versions_agree .; then ok "CHANGELOG.md's newest release is every crate's version"; else bad "versions disagree"; fi

echo "docs: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
