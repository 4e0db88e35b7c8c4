#!/usr/bin/env python3
"""Checks that every relative link in the project's documentation resolves, and every docs/
citation in the code.

  ci/check-links.py [--root DIR]

Documentation: README.md, CHANGELOG.md and every docs/**/*.md under the root. In each, every
Markdown link or image `[text](target)` and reference definition `[label]: target` whose target
is relative (not http:, https:, mailto:) must name a file or directory that exists, relative to
the file that links; a `#anchor` (alone: the same file) must name a heading of the target
Markdown file, spelt as GitHub makes anchors: lowercase, punctuation dropped but `-` and `_`,
each space a `-`, a repeated heading suffixed `-1`, `-2`, ... Links inside code (fenced blocks,
backquotes) are text, not links.

Code: every `docs/<name>.md` or `docs/<name>.md#<anchor>` written in a file under src/, softroce/src,
doctor/src, ci/, include/ (and the tests, c_shim/, nccl-tests-harness/, the fuzz targets and the
Makefile) must resolve the same way, relative to the root, so that the code's
citations lead somewhere.

Prints one line per broken target, `file:line: 'target': why`, and exits 1 if there is any, 0
otherwise. Standard library only.
"""

import argparse
import os
import re
import sys

DOC_FILES = ["README.md", "CHANGELOG.md"]
DOC_TREE = "docs"
CODE_DIRS = ["src", "softroce/src", "doctor/src", "ci", "include", "tests", "softroce/tests", "c_shim",
             "nccl-tests-harness", "fuzz/fuzz_targets", "Makefile"]
CODE_CITATION = re.compile(r"\bdocs/[A-Za-z0-9_./-]*?\.md(?:#[A-Za-z0-9_-]+)?")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def prose_lines(path, blank_code=True):
    """(line number, text) of the lines outside fenced code blocks, code spans blanked unless
    `blank_code` is false."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    fence = None
    for no, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield no, re.sub(r"(`+)(?:(?!\1).)+?\1", "``", line) if blank_code else line


_anchors = {}


def anchors(path):
    """The anchors a Markdown file defines (cached)."""
    if path not in _anchors:
        found, seen = set(), {}
        for _, line in prose_lines(path, blank_code=False):
            for name in HTML_ID.findall(line):
                found.add(name)
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2).replace("`", ""))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def resolve(target, base_dir, self_path):
    """None when `target` resolves, else why it does not."""
    path, _, anchor = target.partition("#")
    if path:
        full = os.path.normpath(os.path.join(base_dir, path))
        if not os.path.exists(full):
            return "no such file"
    else:
        full = self_path
    if anchor and full.endswith(".md") and os.path.isfile(full):
        if anchor not in anchors(full):
            return f"no heading with the anchor #{anchor} in {os.path.relpath(full)}"
    return None


def external(target):
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None


def check_doc(path, problems):
    base = os.path.dirname(path)
    for no, line in prose_lines(path):
        targets = [m.group(1) for m in INLINE_LINK.finditer(line)]
        m = REF_DEF.match(line)
        if m:
            targets.append(m.group(1))
        for t in targets:
            if external(t):
                continue
            why = resolve(t, base, path)
            if why:
                problems.append(f"{os.path.relpath(path)}:{no}: '{t}': {why}")


def check_code(path, root, problems):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, OSError):
        return
    for no, line in enumerate(text.split("\n"), 1):
        for m in CODE_CITATION.finditer(line):
            start = m.start()
            if start > 0 and (line[start - 1].isalnum() or line[start - 1] in "_-"):
                continue  # part of a longer name (another folder of that name)
            why = resolve(m.group(0), root, None)
            if why:
                problems.append(f"{os.path.relpath(path)}:{no}: '{m.group(0)}': {why}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    os.chdir(args.root)
    root = "."
    docs = [f for f in DOC_FILES if os.path.isfile(f)]
    for d, _, files in os.walk(DOC_TREE):
        docs += [os.path.join(d, f) for f in sorted(files) if f.endswith(".md")]
    problems = []
    for f in docs:
        check_doc(f, problems)
    code = 0
    for top in CODE_DIRS:
        if os.path.isfile(top):
            code += 1
            check_code(top, root, problems)
        for d, dirs, files in os.walk(top):
            dirs[:] = [x for x in dirs if x not in ("target", ".git")]
            for f in sorted(files):
                code += 1
                check_code(os.path.join(d, f), root, problems)
    for p in problems:
        print(p)
    print(f"check-links: {len(docs)} documents, {code} code files, {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
