#!/usr/bin/python3
"""Judges one benchmark's figures against the targets file.

    tests/bench/judge.py <bench> [--figures FILE] [--targets FILE] [--smoke]

Reads the figures a benchmark measured, one `<bench>.<figure><TAB><value>` line each,
from `$BENCH_OUT/figures/<bench>.tsv` (BENCH_OUT defaults to target/bench), and the
targets from `$BENCH_TARGETS` (default tests/bench/targets.toml): one table per figure,
`[<bench>.<figure>]`, with `max` or `min` for the full run and `smoke_max` or `smoke_min`
for the reduced scale (`BENCH_SMOKE=1` or `--smoke`). Prints a Markdown table of figure,
measured, bound and verdict, and exits 1 naming every missed figure. A figure with a bound
that the benchmark did not measure is a miss: a benchmark that stopped measuring
something must not pass. A figure measured with no target is listed as recorded.

The table is also appended to `$BENCH_OUT/verdicts.md`, which tests/bench/check.sh prints
at the end of a run.
"""

import argparse
import math
import os
import sys
import tomllib


def load_targets(path, bench):
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    table = doc.get(bench)
    if not isinstance(table, dict):
        return {}
    return {f"{bench}.{name}": t for name, t in table.items() if isinstance(t, dict)}


def load_figures(path):
    figures = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise SystemExit(f"judge: {path}:{n}: not <figure><TAB><value>: {line!r}")
            try:
                value = float(parts[1])
            except ValueError:
                raise SystemExit(f"judge: {path}:{n}: {parts[1]!r} is not a number") from None
            figures[parts[0]] = value
    return figures


def bound(target, smoke):
    """(kind, value) of the bound in force, kind "max" or "min"; None if not judged."""
    prefix = "smoke_" if smoke else ""
    for kind in ("max", "min"):
        if prefix + kind in target:
            return kind, float(target[prefix + kind])
    return None


def fmt(value):
    if value is None:
        return "-"
    if math.isfinite(value) and value == int(value) and abs(value) < 1e12:
        return f"{int(value)}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench")
    ap.add_argument("--figures")
    ap.add_argument("--targets", default=os.environ.get("BENCH_TARGETS"))
    ap.add_argument("--smoke", action="store_true",
                    default=os.environ.get("BENCH_SMOKE", "") not in ("", "0"))
    args = ap.parse_args()

    out = os.environ.get("BENCH_OUT") or "target/bench"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    targets_path = args.targets or os.path.join(root, "tests/bench/targets.toml")
    figures_path = args.figures or os.path.join(out, "figures", f"{args.bench}.tsv")

    targets = load_targets(targets_path, args.bench)
    figures = load_figures(figures_path) if os.path.exists(figures_path) else {}
    if not targets:
        raise SystemExit(f"judge: {targets_path} has no targets for {args.bench!r}")

    run = "smoke" if args.smoke else "full"
    shown = targets_path
    if os.path.abspath(targets_path).startswith(root + os.sep):
        shown = os.path.relpath(os.path.abspath(targets_path), root)
    rows, missed = [], []
    for name in list(targets) + sorted(set(figures) - set(targets)):
        target = targets.get(name)
        value = figures.get(name)
        unit = target.get("unit", "") if target else ""
        b = bound(target, args.smoke) if target else None
        if b is None:
            verdict = "recorded" if target is None else f"full run only ({fmt(target.get('max', target.get('min')))})"
            rows.append((name, value, unit, "-", verdict))
            continue
        kind, limit = b
        sign = "<=" if kind == "max" else ">="
        if value is None or not math.isfinite(value):
            verdict = "MISSED (not measured)"
            missed.append(f"{name} (not measured; bound {sign} {fmt(limit)} {unit})")
        elif (value <= limit) if kind == "max" else (value >= limit):
            verdict = "met"
        else:
            verdict = "MISSED"
            missed.append(f"{name} (measured {fmt(value)} {unit}, bound {sign} {fmt(limit)} {unit})")
        rows.append((name, value, unit, f"{sign} {fmt(limit)}", verdict))

    lines = [
        f"### {args.bench} ({run} run, targets from {shown})",
        "",
        "| figure | measured | unit | bound | verdict |",
        "|---|---:|---|---|---|",
    ]
    lines += [f"| {n} | {fmt(v)} | {u} | {b} | {verdict} |" for n, v, u, b, verdict in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "verdicts.md"), "a", encoding="utf-8") as f:
        f.write(text + "\n")
    if missed:
        print(f"{args.bench}: {len(missed)} figure(s) missed: " + "; ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
