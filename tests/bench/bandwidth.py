#!/usr/bin/python3
"""Benchmark driver for bandwidth: ours against the reference, in one run.

Started by tests/bench/bandwidth.sh. Each suite gets its own throwaway host netns with
the reference bridge (and host-local) wiring its pods, not timed, so that both suites'
bandwidth gets the same prevResult. What is timed is the bandwidth call alone, with
ingress and egress limits set: ADD makes a TBF on the host veth (the pod's ingress), an
ifb device, a redirect of the host veth's ingress to it and a TBF on it (the pod's
egress); DEL removes the ifb. Suites alternate round by round.

The second figure set is what the shaping does to a pod's traffic: a ping from a shaped
pod (80 Mbit/s each way) to an unshaped one on the same bridge while TCP transfers
saturate both directions through the shaped pod. The queues are the kernel's TBFs either
way; what the plugin decides is their burst and limit, so the ping's latency shows
whether ours sizes them as the reference does.

Figures go to `$BENCH_OUT/figures/bandwidth.tsv` (call ratios of p50 wall time in a full
run, of CPU time in a smoke run: see bench.plugin_figures; ping ratios of p50 and p99),
a summary.csv and machine.txt beside them; bandwidth.sh judges them with judge.py.

`--sink PORT` and `--source HOST PORT SECONDS` are the TCP ends of the transfer (run
inside the pods by the driver itself).
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the shared timing and namespace helpers)

RATE = 80_000_000  # bits/s, each way
BURST = 800_000  # bits (100 KB): above the MTU, well under the 25 ms queue of the limit
SUBNET = "10.124.0.0/16"
PORT = 5201
# TCP flows each way: several keep the queue near its limit (one flow's sawtooth makes
# the ping's percentiles depend on where in it the pings fall).
FLOWS = 4


def bridge_conf(data_dir):
    return {
        "cniVersion": "1.0.0",
        "name": "bwbench",
        "type": "bridge",
        "bridge": "bwbr0",
        "isGateway": True,
        "ipam": {"type": "host-local", "subnet": SUBNET, "dataDir": data_dir},
    }


def bandwidth_conf(prev):
    return {
        "cniVersion": "1.0.0",
        "name": "bwbench",
        "type": "bandwidth",
        "runtimeConfig": {"bandwidth": {
            "ingressRate": RATE, "ingressBurst": BURST,
            "egressRate": RATE, "egressBurst": BURST,
        }},
        "prevResult": prev,
    }


class Suite:
    """One suite's host netns, its bridge (the reference's, for both) and its pods."""

    def __init__(self, name, plugins, wiring, index):
        self.name, self.plugins, self.wiring = name, plugins, wiring
        self.host = f"{bench.TAG}-bw-{index}"
        self.data_dir = f"/run/{bench.TAG}-bw-{index}-ipam"
        bench.ns_add(self.host)
        self.prev = {}

    def pod_up(self, pod, cid):
        """Bridge ADD (not timed); returns the prevResult."""
        bench.ns_add(pod)
        ok, _, out = self.call(self.wiring, "bridge", "ADD", cid, pod, bridge_conf(self.data_dir))
        if not ok:
            raise RuntimeError(f"{self.name}: bridge ADD {pod}: {out[-300:]!r}")
        self.prev[pod] = json.loads(out)
        return self.prev[pod]

    def pod_down(self, pod, cid):
        conf = dict(bridge_conf(self.data_dir), prevResult=self.prev.pop(pod, None))
        self.call(self.wiring, "bridge", "DEL", cid, pod, conf)
        bench.ns_del([pod])

    def call(self, plugins, binary, op, cid, pod, conf):
        bench.enter(self.host)
        try:
            return plugins.call(binary, op, cid, pod, conf)
        finally:
            bench.enter(None)

    def bandwidth(self, op, cid, pod):
        return self.call(self.plugins, "bandwidth", op, cid, pod,
                         bandwidth_conf(self.prev[pod]))


def pod_ip(prev):
    return prev["ips"][0]["address"].split("/")[0]


def ping_under_load(suite, r, count, interval):
    """RTTs (ms) of `count` pings from a shaped pod to an unshaped one while TCP
    transfers saturate both directions through the shaped pod."""
    shaped, peer = f"{suite.host}-ps{r}", f"{suite.host}-pp{r}"
    cid_s, cid_p = f"bws-{r}", f"bwp-{r}"
    suite.pod_up(shaped, cid_s)
    suite.pod_up(peer, cid_p)
    procs = []
    try:
        ok, _, out = suite.bandwidth("ADD", cid_s, shaped)
        if not ok:
            raise RuntimeError(f"{suite.name}: bandwidth ADD {shaped}: {out[-300:]!r}")
        ip_s, ip_p = pod_ip(suite.prev[shaped]), pod_ip(suite.prev[peer])
        seconds = count * interval + 4
        me = os.path.abspath(__file__)
        for ns in (shaped, peer):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, me, "--sink", str(PORT)]))
        time.sleep(0.3)
        for ns, dst in ((shaped, ip_p), (peer, ip_s)):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, me, "--source", dst, str(PORT),
                 str(seconds)]))
        time.sleep(1.5)  # let the TCP windows grow and the queues fill
        p = subprocess.run(["ip", "netns", "exec", shaped, "ping", "-n", "-i", str(interval),
                            "-c", str(count), "-W", "2", ip_p],
                           capture_output=True, text=True)
        rtts = [float(x) for x in re.findall(r"time=([0-9.]+) ms", p.stdout)]
        if len(rtts) < count * 0.9:
            raise RuntimeError(f"{suite.name}: {len(rtts)} of {count} pings answered")
        suite.bandwidth("DEL", cid_s, shaped)
        return rtts
    finally:
        for p in procs:
            p.kill()
            p.wait()
        suite.pod_down(shaped, cid_s)
        suite.pod_down(peer, cid_p)


def sink(port):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # A fixed, large receive window: with autotuning each connection's window settles
    # somewhere else, and the queue with it (a standing queue of window minus BDP);
    # unlimited by the window, the flows fill the TBF to the limit the plugin gave it.
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    srv.bind(("0.0.0.0", port))
    srv.listen(FLOWS)

    def drain(conn):
        while conn.recv(1 << 16):
            pass

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def source(host, port, seconds):
    deadline = time.time() + seconds

    def send():
        for _ in range(50):
            try:
                s = socket.create_connection((host, port))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
                break
            except OSError:
                time.sleep(0.1)
        else:
            return
        chunk = b"\0" * (1 << 16)
        while time.time() < deadline:
            s.sendall(chunk)

    threads = [threading.Thread(target=send, daemon=True) for _ in range(FLOWS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def figures(samples, pings, smoke):
    k = 1 if smoke else 0  # index into (wall ms, CPU ms)

    def p50(suite, op):
        got = [x[k] for x in samples[(suite, op)]]
        return bench.pct(got, 50) if got else None

    figs = {}
    for op in ("ADD", "DEL"):
        figs[f"{op.lower()}_vs_ref"] = bench.quotient(p50("ours", op), p50("ref", op))
    for p in (50, 99):
        o, r = pings["ours"], pings["ref"]
        figs[f"ping_p{p}_vs_ref"] = bench.quotient(
            bench.pct(o, p) if o else None, bench.pct(r, p) if r else None)
    return figs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours")
    ap.add_argument("--ref")
    ap.add_argument("--rounds", type=int, default=os.environ.get("BENCH_ROUNDS"))
    ap.add_argument("--pods", type=int, default=os.environ.get("BENCH_PODS"))
    ap.add_argument("--pings", type=int, default=os.environ.get("BENCH_PINGS"))
    ap.add_argument("--out", default=os.environ.get("BENCH_OUT") or "target/bench")
    ap.add_argument("--smoke", "--quick", action="store_true",
                    help="reduced scale (tests/bench/check.sh --smoke)")
    ap.add_argument("--sink", type=int)
    ap.add_argument("--source", nargs=3)
    args = ap.parse_args()
    if args.sink:
        return sink(args.sink)
    if args.source:
        return source(args.source[0], int(args.source[1]), float(args.source[2]))
    rounds = int(args.rounds or (6 if args.smoke else 3))
    pods = int(args.pods or (3 if args.smoke else 30))
    # Pings per suite and round, 5 ms apart; rounds alternating between the suites (the
    # queue's level moves from round to round: see docs/performance.md#bandwidth).
    pings = int(args.pings or (400 if args.smoke else 1500))
    ping_rounds = int(os.environ.get("BENCH_PING_ROUNDS") or (3 if args.smoke else 4))
    interval = 0.005
    out_dir = os.path.join(args.out, "bandwidth")
    os.makedirs(out_dir, exist_ok=True)
    bench.start_figures(args.out, "bandwidth")
    load0, started = os.getloadavg(), time.time()
    ref = bench.Plugins("ref", args.ref)
    plugins = {"ours": bench.Plugins("ours", args.ours), "ref": ref}
    samples = {(s, op): [] for s in plugins for op in ("ADD", "DEL")}
    rtts = {s: [] for s in plugins}
    errors = []
    try:
        suites = [Suite(name, p, ref, i) for i, (name, p) in enumerate(plugins.items())]
        for r in range(rounds):
            for s in suites:
                names = [(f"{s.host}-p{r}-{i}", f"bw-{r}-{i}") for i in range(pods)]
                for pod, cid in names:
                    s.pod_up(pod, cid)
                for op in ("ADD", "DEL"):
                    for pod, cid in names:
                        ok, ms, out = s.bandwidth(op, cid, pod)
                        if ok:
                            samples[(s.name, op)].append(ms)
                        else:
                            errors.append(f"{s.name} {op} {pod}: {out[-300:]!r}")
                for pod, cid in names:
                    s.pod_down(pod, cid)
            bench.log(f"round {r + 1}/{rounds} done")
        for r in range(ping_rounds):
            for s in suites:
                got = ping_under_load(s, r, pings, interval)
                bench.log(f"{s.name}: ping p50 {bench.pct(got, 50):.1f} ms, "
                          f"p99 {bench.pct(got, 99):.1f} ms")
                rtts[s.name] += got
            bench.log(f"ping round {r + 1}/{ping_rounds} done")
    finally:
        bench.cleanup()
        for i in range(len(plugins)):
            subprocess.run(["rm", "-rf", f"/run/{bench.TAG}-bw-{i}-ipam"])
    print("| op | suite | n | p50 ms | p99 ms | p50 / ref | CPU p50 ms | CPU p50 / ref |")
    print("|---|---|---|---|---|---|---|---|")
    summary = []
    for op in ("ADD", "DEL"):
        ref_ms = [x[0] for x in samples[("ref", op)]]
        ref_cpu = [x[1] for x in samples[("ref", op)]]
        for name in plugins:
            ms = [x[0] for x in samples[(name, op)]]
            cpu = [x[1] for x in samples[(name, op)]]
            if not ms:
                continue
            p50, p99, cpu50 = bench.pct(ms, 50), bench.pct(ms, 99), bench.pct(cpu, 50)
            print(f"| {op} | {name} | {len(ms)} | {p50:.2f} | {p99:.2f} | "
                  f"{bench.ratio(p50, bench.pct(ref_ms, 50))} | {cpu50:.2f} | "
                  f"{bench.ratio(cpu50, bench.pct(ref_cpu, 50))} |")
            summary.append({"op": op, "suite": name, "n": len(ms), "p50_ms": round(p50, 2),
                            "p99_ms": round(p99, 2), "cpu_p50_ms": round(cpu50, 2)})
    print()
    print("| ping under load | n | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    for name in plugins:
        x = rtts[name]
        if x:
            print(f"| {name} | {len(x)} | {bench.pct(x, 50):.2f} | {bench.pct(x, 99):.2f} | "
                  f"{max(x):.2f} |")
            summary.append({"op": "ping", "suite": name, "n": len(x),
                            "p50_ms": round(bench.pct(x, 50), 2),
                            "p99_ms": round(bench.pct(x, 99), 2), "cpu_p50_ms": ""})
    bench.write_csv(os.path.join(out_dir, "summary.csv"), summary)
    bench.write_run_info(out_dir, started, load0, os.getloadavg(),
                         f"{rounds} rounds x {pods} pods per suite; "
                         f"{ping_rounds} x {pings} pings per suite", args.smoke)
    bench.write_figures(args.out, "bandwidth", figures(samples, rtts, args.smoke))
    if errors:
        print(f"\nerrors ({len(errors)}):")
        for e in errors[:20]:
            print(f"  {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
