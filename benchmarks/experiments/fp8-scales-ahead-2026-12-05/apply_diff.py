"""Apply a ``git diff`` (unified, text files, no renames) under a folder, without git: the
device machine may lack it. Every hunk's old lines must match exactly at the line the hunk
names or, failing that, at exactly one place in the file; otherwise nothing is written and
the hunk is named. New files (``--- /dev/null``) are created.

    python3 apply_diff.py PATCH --root DIR [--reverse]
"""

from __future__ import annotations

import argparse
import os
import re
import sys

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def parse(text: str) -> list[tuple[str | None, str, list[tuple[int, list[str], list[str]]]]]:
    """``[(old path or None for a new file, new path, [(old start, old lines, new lines)])]``."""
    files, lines, i = [], text.splitlines(keepends=True), 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        old = lines[i][4:].strip()
        new = lines[i + 1][4:].strip()
        old = None if old == "/dev/null" else old.removeprefix("a/")
        hunks, i = [], i + 2
        while i < len(lines) and lines[i].startswith("@@"):
            start = int(_HUNK.match(lines[i]).group(1))
            a, b, i = [], [], i + 1
            while i < len(lines) and lines[i][:1] in (" ", "-", "+", "\\"):
                tag, body = lines[i][:1], lines[i][1:]
                if tag == "\\":  # "\ No newline at end of file": the line before has none
                    for side in (a, b):
                        if side and side[-1].endswith("\n"):
                            side[-1] = side[-1][:-1]
                elif tag == " ":
                    a.append(body)
                    b.append(body)
                elif tag == "-":
                    a.append(body)
                else:
                    b.append(body)
                i += 1
            hunks.append((start, a, b))
        files.append((old, new.removeprefix("b/"), hunks))
    return files


def apply(text: str, root: str, reverse: bool = False) -> list[str]:
    """Apply (or undo) the patch under ``root``; returns the paths written. Raises
    ValueError naming the file and hunk that does not match (nothing written then)."""
    out: dict[str, str] = {}
    for old, new, hunks in parse(text):
        path = os.path.join(root, new)
        if reverse:
            hunks = [(s, b, a) for s, a, b in hunks]
        src = "" if (old is None and not reverse) else open(path).read()
        lines = src.splitlines(keepends=True)
        for n, (start, a, b) in reversed(list(enumerate(hunks))):
            at = max(start - 1, 0)
            if lines[at:at + len(a)] != a:
                spots = [j for j in range(len(lines) - len(a) + 1) if lines[j:j + len(a)] == a]
                if len(spots) != 1:
                    raise ValueError(f"{new}: hunk {n + 1} (line {start}) matches "
                                     f"{len(spots)} places")
                at = spots[0]
            lines[at:at + len(a)] = b
        out[path] = "".join(lines)
    for path, body in out.items():
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write(body)
    return list(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("patch")
    ap.add_argument("--root", default=".")
    ap.add_argument("--reverse", action="store_true")
    args = ap.parse_args()
    try:
        written = apply(open(args.patch).read(), args.root, args.reverse)
    except (OSError, ValueError) as exc:
        print(f"apply_diff: {exc}", file=sys.stderr)
        return 1
    print(f"apply_diff: {len(written)} files under {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
