#!/usr/bin/python3
"""Benchmark driver for portmap: ours against the reference, in one run.

Started by tests/bench/portmap.sh. Each suite gets its own throwaway host netns; per
round, PODS pods get two host ports each (TCP and UDP) with ADD, then CHECK, then DEL,
suites alternating round by round. The pods' addresses come from a made-up prevResult
(portmap reads nothing else of a pod), so what is timed is the plugin and its firewall
work: process start, iptables-save/iptables-restore (or the nf_tables transaction),
conntrack. Timing and cleanup come from bench.py.

It writes its figures to `$BENCH_OUT/figures/portmap.tsv` (p50 of wall time in a full
run, of CPU time in a smoke run: see bench.plugin_figures) and a summary.csv and
machine.txt beside them; portmap.sh judges them with judge.py.

Suites: "ours iptables", "ref iptables" (the reference 1.1.1 has only iptables) and
"ours nftables", each with one TCP host port per pod and with a TCP and a UDP one (a UDP
mapping costs both plugins a walk of the kernel's conntrack table per family, to forget
stale entries). "ours nftables" answers "what does portmap on nftables add to a pod's
ADD": the runtime runs it as its own process after the bridge, so its whole wall time
is what a pod start pays for it. "ours no mappings" is the floor of any such call: a
portmap ADD with nothing to map (exec, parse, print), timed the same way.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the shared timing and namespace helpers)


def conf(i, backend, udp, with_prev):
    if udp is None:
        # The floor: a portmap call with nothing to map (parses, prints prevResult).
        mappings = []
    else:
        mappings = [{"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"}]
    if udp:
        mappings.append({"hostPort": 30000 + i, "containerPort": 53, "protocol": "udp"})
    c = {
        "cniVersion": "1.0.0",
        "name": "pmbench",
        "type": "portmap",
        "runtimeConfig": {"portMappings": mappings},
    }
    if backend:
        c["backend"] = backend
    if with_prev:
        c["prevResult"] = {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/pmbench"}],
            "ips": [
                {"address": f"10.77.{i // 250}.{i % 250 + 2}/16", "interface": 0},
                {"address": f"fd00:77::{i + 2:x}/64", "interface": 0},
            ],
        }
    return c


def portmap_figures(samples, smoke):
    """The figures targets.toml judges: p50 ratios against the reference on iptables
    (TCP, TCP+UDP), ours on nftables against the same reference, and what portmap on
    nftables adds to a pod's ADD with one TCP port (its whole call)."""
    k = 1 if smoke else 0  # index into (wall ms, CPU ms)

    def p50(suite, op):
        got = [x[k] for x in samples.get((suite, op), [])]
        return bench.pct(got, 50) if got else None

    figs = {}
    for backend in ("iptables", "nftables"):
        for ports, key in (("tcp", ""), ("tcp+udp", "_udp")):
            for op in ("ADD", "CHECK", "DEL"):
                if backend == "nftables" and op == "ADD" and ports == "tcp":
                    continue  # judged in ms below
                figs[f"{backend}_{op.lower()}{key}_vs_ref"] = bench.quotient(
                    p50(f"ours {backend} {ports}", op), p50(f"ref iptables {ports}", op))
    figs["nftables_add_ms"] = p50("ours nftables tcp", "ADD")
    figs["no_mappings_add_ms"] = p50("ours no mappings", "ADD")
    return figs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--rounds", type=int, default=os.environ.get("BENCH_ROUNDS"))
    ap.add_argument("--pods", type=int, default=os.environ.get("BENCH_PODS"))
    ap.add_argument("--out", default=os.environ.get("BENCH_OUT") or "target/bench")
    ap.add_argument("--smoke", "--quick", action="store_true",
                    help="reduced scale (tests/bench/check.sh --smoke)")
    args = ap.parse_args()
    # Smoke: 6 rounds of 3 pods, so that the suites alternate often.
    rounds = int(args.rounds or (6 if args.smoke else 3))
    pods = int(args.pods or (3 if args.smoke else 30))
    out_dir = os.path.join(args.out, "portmap")
    os.makedirs(out_dir, exist_ok=True)
    bench.start_figures(args.out, "portmap")
    load0, started = os.getloadavg(), time.time()
    ours, ref = bench.Plugins("ours", args.ours), bench.Plugins("ref", args.ref)
    suites = [("ours no mappings", ours, "nftables", None)]
    for udp, ports in ((False, "tcp"), (True, "tcp+udp")):
        suites += [
            (f"ours iptables {ports}", ours, "iptables", udp),
            (f"ref iptables {ports}", ref, None, udp),
            (f"ours nftables {ports}", ours, "nftables", udp),
        ]
    samples = {(s[0], op): [] for s in suites for op in ("ADD", "CHECK", "DEL")}
    errors = []
    try:
        hosts = {}
        for name, *_ in suites:
            host = f"{bench.TAG}-pm-{len(hosts)}"
            bench.ns_add(host)
            hosts[name] = host
        for r in range(rounds):
            for name, plugins, backend, udp in suites:
                bench.enter(hosts[name])
                try:
                    for op in ("ADD", "CHECK", "DEL"):
                        for i in range(pods):
                            ok, ms, out = plugins.call(
                                "portmap", op, f"pm-{r}-{i}", "pmbench",
                                conf(i, backend, udp, op != "DEL"))
                            # The reference 1.1.1 fails every CHECK with mappings
                            # (it looks for its IPv4 rules in ip6tables): its CHECK
                            # times are of that failure.
                            if ok or (op == "CHECK" and name.startswith("ref")):
                                samples[(name, op)].append(ms)
                            else:
                                errors.append(f"{name} {op} {i}: {out[-300:]!r}")
                finally:
                    bench.enter(None)
            bench.log(f"round {r + 1}/{rounds} done")
    finally:
        bench.cleanup()
    print("| op | suite | n | p50 ms | p99 ms | p50 / ref iptables | CPU p50 ms |")
    print("|---|---|---|---|---|---|---|")
    summary = []
    for op in ("ADD", "CHECK", "DEL"):
        for name, _, _, udp in suites:
            ref_suite = "ref iptables " + ("tcp+udp" if udp else "tcp")
            ref = bench.pct([x[0] for x in samples[(ref_suite, op)]], 50)
            ms = [x[0] for x in samples[(name, op)]]
            cpu = [x[1] for x in samples[(name, op)]]
            p50, p99, cpu50 = bench.pct(ms, 50), bench.pct(ms, 99), bench.pct(cpu, 50)
            print(f"| {op} | {name} | {len(ms)} | {p50:.2f} | {p99:.2f} | "
                  f"{bench.ratio(p50, ref)} | {cpu50:.2f} |")
            summary.append({"op": op, "suite": name, "n": len(ms), "p50_ms": round(p50, 2),
                            "p99_ms": round(p99, 2), "cpu_p50_ms": round(cpu50, 2)})
    bench.write_csv(os.path.join(out_dir, "summary.csv"), summary)
    bench.write_run_info(out_dir, started, load0, os.getloadavg(),
                         f"{rounds} rounds x {pods} pods per suite", args.smoke)
    bench.write_figures(args.out, "portmap", portmap_figures(samples, args.smoke))
    if errors:
        print(f"\nerrors ({len(errors)}):")
        for e in errors[:20]:
            print(f"  {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
