#!/usr/bin/env python3
"""Turns `perf script` output into a flame graph (SVG) and the top functions (text).

Usage: perf script -i FILE... | scripts/flamegraph.py --title T --svg OUT.svg --top OUT.txt

Hand-rolled because Debian has no flame graph package (Brendan Gregg's FlameGraph scripts are
not packaged) and perf's own `perf script report flamegraph` writes an HTML page that loads
its JavaScript from the network when opened. Swift symbols are demangled with
`swift demangle --simplified` (the toolchain's), C++ ones are demangled by perf already.
"""
import argparse
import collections
import html
import re
import shutil
import subprocess
import sys

FRAME = re.compile(r"^\s*[0-9a-f]+\s+(.*?)(\+0x[0-9a-f]+)?\s+\((.*)\)\s*$")


PLUMBING = ("thunk for", "reabstraction thunk", "_dispatch_", "swift::runJob", "swift_job_run")


def read_stacks(lines):
    """Yields each sample's stack, root first, as a list of raw symbol names."""
    stack = []
    in_sample = False
    for line in lines:
        if not line.strip():
            if stack:
                yield list(reversed(stack))
            stack, in_sample = [], False
            continue
        if not line.startswith((" ", "\t")):
            in_sample = True  # the sample's header line (comm, pid, time, event)
            continue
        m = FRAME.match(line)
        if in_sample and m:
            name = m.group(1)
            if name == "[unknown]":
                name = "[" + m.group(3).rsplit("/", 1)[-1] + "]"
            stack.append(name)
    if stack:
        yield list(reversed(stack))


def demangle(names):
    """Maps each Swift-mangled name to its simplified demangling (others unchanged)."""
    mangled = sorted(n for n in names if n.startswith(("$s", "_$s", "$S")))
    table = {}
    tool = shutil.which("swift-demangle") or shutil.which("swift")
    if mangled and tool:
        args = [tool, "--simplified", "--compact"] if tool.endswith("swift-demangle") else [tool, "demangle", "--simplified", "--compact"]
        out = subprocess.run(args, input="\n".join(mangled) + "\n", capture_output=True, text=True).stdout.splitlines()
        if len(out) == len(mangled):
            table = dict(zip(mangled, out))
    return {n: shorten(table.get(n, n)) for n in names}


def shorten(name):
    """Drops argument lists and generic clutter so a frame's name fits its box."""
    name = re.sub(r"^(partial apply for |closure #\d+ in |implicit closure #\d+ in |specialized |merged |outlined .*? of )+", "", name)
    depth, out = 0, []
    for ch in name:  # remove (...) argument lists, keep the function's own name
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = "".join(out).strip() or name
    return short[:160]


def collapse(stacks):
    counts = collections.Counter()
    for s in stacks:
        counts[tuple(s)] += 1
    return counts


def tree_of(counts):
    root = {"name": "all", "value": 0, "children": {}}
    for stack, n in counts.items():
        root["value"] += n
        node = root
        for frame in stack:
            child = node["children"].setdefault(frame, {"name": frame, "value": 0, "children": {}})
            child["value"] += n
            node = child
    return root


def color(name):
    h = sum(ord(c) for c in name) % 60
    if name.startswith("[") or "kernel" in name:
        return f"rgb(220,{120 + h},{80 + h // 2})"
    if any(k in name for k in ("sqlite", "GRDB")):
        return f"rgb(90,{140 + h},{200})"
    if any(k in name.lower() for k in ("deflate", "inflate", "crc32", "sha", "aes", "ssl")):
        return f"rgb({170 + h},100,{200 - h})"
    return f"rgb(240,{130 + h},{40 + h // 3})"


def svg(root, title, width=1200, row=16):
    rows = []

    def depth(node):
        return 1 + max((depth(c) for c in node["children"].values()), default=0)

    levels = depth(root)
    height = levels * row + 60
    total = root["value"] or 1

    def walk(node, x, level):
        w = node["value"] / total * (width - 20)
        if w < 2.0:  # narrower frames are invisible at this width and only weigh the file
            return
        y = height - 20 - (level + 1) * row
        pct = 100.0 * node["value"] / total
        label = html.escape(node["name"])
        text = node["name"] if w > 40 else ""
        max_chars = int(w / 6.5)
        if len(text) > max_chars:
            text = text[: max(0, max_chars - 2)] + ".." if max_chars > 3 else ""
        rows.append(
            f'<g><title>{label} ({node["value"]} samples, {pct:.2f}%)</title>'
            f'<rect x="{x + 10:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" fill="{color(node["name"])}" rx="2"/>'
            + (f'<text x="{x + 13:.1f}" y="{y + row - 4}">{html.escape(text)}</text>' if text else "")
            + "</g>"
        )
        cx = x
        for child in sorted(node["children"].values(), key=lambda c: c["name"]):
            walk(child, cx, level + 1)
            cx += child["value"] / total * (width - 20)

    walk(root, 0, 0)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">'
        f'<rect width="100%" height="100%" fill="#fdfdf6"/>'
        f'<text x="{width // 2}" y="20" text-anchor="middle" font-size="15">{html.escape(title)}</text>'
        f'<text x="10" y="40" font-size="11" fill="#555">{total} samples; width is the share of CPU, stacks grow upward; hover a frame for its name and share</text>'
        + "".join(rows)
        + "</svg>\n"
    )


def top(counts, title, n=20):
    total = sum(counts.values()) or 1
    own = collections.Counter()
    inclusive = collections.Counter()
    for stack, c in counts.items():
        own[stack[-1]] += c
        for frame in set(stack):
            inclusive[frame] += c
    lines = [f"{title}: {total} samples", "", f"Top {n} functions by own time (self):"]
    lines += [f"  {100.0 * c / total:5.1f}%  {name}" for name, c in own.most_common(n)]
    lines += ["", f"Top {n} functions by time including callees (thread roots and dispatch plumbing left out):"]
    roots = {"all", "start_thread", "clone3", "clone", "_start", "main", "__libc_start_main"}
    plumbing = PLUMBING + ("Dispatch", "static ThreadOpsPosix", "static MultiThreadedEventLoopGroup")
    shown = [(name, c) for name, c in inclusive.most_common() if name not in roots and not name.startswith(("[",) + plumbing)][:n]
    lines += [f"  {100.0 * c / total:5.1f}%  {name}" for name, c in shown]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--title", required=True)
    p.add_argument("--svg", required=True)
    p.add_argument("--top", required=True)
    p.add_argument("inputs", nargs="*", help="perf script text files (default: stdin)")
    a = p.parse_args()
    sources = [open(f, errors="replace") for f in a.inputs] or [sys.stdin]
    raw = collections.Counter()
    for src in sources:
        for stack in read_stacks(src):
            raw[tuple(stack)] += 1
    if not raw:
        sys.exit(f"flamegraph: no samples with stacks for {a.title}")
    names = demangle({f for s in raw for f in s})
    counts = collections.Counter()
    for stack, n in raw.items():
        # Reabstraction thunks and dispatch's trampolines say nothing of where time goes,
        # and Swift's stacks are deep enough without them.
        frames = tuple(names[f] for f in stack if not names[f].startswith(PLUMBING))
        counts[frames or ("all",)] += n
    with open(a.svg, "w") as f:
        f.write(svg(tree_of(counts), a.title))
    with open(a.top, "w") as f:
        f.write(top(counts, a.title))


if __name__ == "__main__":
    main()
