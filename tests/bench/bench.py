#!/usr/bin/python3
"""Benchmark driver: bridge + host-local, ours against the reference and the kernel floor.

Started by tests/bench/run.sh (which builds our release binaries and installs what this
needs); see docs/performance.md for what it measures and how to read it.

Every plugin call runs in a throwaway "host" network namespace per suite and scenario,
with one throwaway pod namespace per pod; the driver enters the host namespace with
setns(2) on the calling thread only, so the plugin process is started directly (no
`ip netns exec` in the measured time) and the machine's own namespace is never changed.
Everything created is removed on exit, also on an error or a signal.

Timing is wall time from the fork to the reaped exit, process start and the IPAM delegate
included, and the CPU time of the process tree (see `timed`). Peak RSS is measured in separate calls under GNU time (%M): the driver's own
ru_maxrss would be wrong: a child forked from the driver reports the driver's (Python's) memory as
its high-water mark at exec; GNU time is small, so what it reports is the plugin's.
For a bridge call that figure is the larger of bridge and its IPAM child (wait4 reports
the maximum over the process and the children it reaped).

The figures that tests/bench/targets.toml judges (`[plugins.*]`) are written to
`<out>/figures/plugins.tsv` (see plugin_figures); run.sh then runs judge.py on them.
"""

import argparse
import concurrent.futures
import csv
import ctypes
import json
import math
import os
import platform
import signal
import shutil
import subprocess
import sys
import tempfile
import time

CLONE_NEWNET = 0x40000000
LIBC = ctypes.CDLL(None, use_errno=True)
TAG = os.environ.get("BENCH_TAG") or f"cb{os.getpid()}"
BRIDGE = "cbr0"
SUBNET4, GW4, PREFIX4 = "10.123.0.0/16", "10.123.0.1", 16
SUBNET6, GW6, PREFIX6 = "fd00:123::/64", "fd00:123::1", 64
ENV_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# Our suite without masquerade in the nftables scenario: the baseline of what
# masquerade on nftables adds, measured beside it.
NO_MASQ = "no-masq"

NAMESPACES = []  # every netns created, deleted on exit
ROOT_NS = os.open("/proc/self/ns/net", os.O_RDONLY)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --- namespaces ----------------------------------------------------------------------


def enter(ns):
    """Moves the calling thread into netns `ns` (a name under /run/netns, or None = back)."""
    fd = ROOT_NS if ns is None else os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if LIBC.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {ns}: {os.strerror(err)}")
    finally:
        if ns is not None:
            os.close(fd)


def sh(argv, stdin=None):
    """Runs a setup/teardown command (not timed); fails loudly."""
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def ns_add(name):
    # Created from the root netns thread: `ip netns add` unshares a fresh one regardless.
    sh(["ip", "netns", "add", name])
    NAMESPACES.append(name)
    sh(["ip", "-n", name, "link", "set", "lo", "up"])


def ns_del(names):
    for name in names:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        if name in NAMESPACES:
            NAMESPACES.remove(name)


def cleanup():
    enter(None)
    ns_del(list(NAMESPACES))


# --- one timed process ---------------------------------------------------------------


def timed(argv, env=None, stdin=b""):
    """Runs argv in the calling thread's netns; returns (ok, (wall ms, CPU ms), stdout).

    CPU time is user + system of the process and the children it reaped (the IPAM
    delegate, iptables-restore, nft): unlike wall time it barely moves with the machine's
    load, but it misses kernel work done outside the process (a veth's deletion finishes
    in kernel workers)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter_ns()
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=err, env=env)
        try:
            p.stdin.write(stdin)
            p.stdin.close()
        except BrokenPipeError:
            pass  # exited without reading its config: its status and output say why
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
        t1 = time.perf_counter_ns()
        p.returncode = os.waitstatus_to_exitcode(status)
        p.stdout.close()
        ok = p.returncode == 0
        if not ok:
            err.seek(0)
            out = out + b" | stderr: " + err.read()[-400:]
    return ok, ((t1 - t0) / 1e6, (ru.ru_utime + ru.ru_stime) * 1e3), out


class Plugins:
    """A suite of plugin binaries (ours or the reference)."""

    # CNI_ARGS of every call (the runtime's pod keys, for suites that read them).
    cni_args = ""
    # Whether the suite's host netns gets the node agent's NetworkPolicy table.
    policy_table = False

    def __init__(self, name, bindir):
        self.name, self.bindir = name, bindir

    def call(self, binary, command, cid, pod, conf, ifname="eth0", rss_file=None):
        env = {"PATH": ENV_PATH, "CNI_COMMAND": command, "CNI_CONTAINERID": cid,
               "CNI_NETNS": f"/run/netns/{pod}", "CNI_IFNAME": ifname,
               "CNI_PATH": self.bindir}
        if self.cni_args:
            env["CNI_ARGS"] = self.cni_args
        argv = [os.path.join(self.bindir, binary)]
        if rss_file:
            argv = ["/usr/bin/time", "-f", "%M", "-o", rss_file] + argv
        return timed(argv, env, json.dumps(conf).encode())


class WithKeys(Plugins):
    """Our suite with extra config keys (e.g. `portSecurity`), under its own name; with
    `cni_args`, the calls' CNI_ARGS; with `policy_table`, its host netns has the node
    agent's NetworkPolicy table (the pending sets `podRecordDir` fills)."""

    def __init__(self, name, bindir, keys, cni_args="", policy_table=False):
        super().__init__(name, bindir)
        self.keys = keys
        self.cni_args, self.policy_table = cni_args, policy_table

    def call(self, binary, command, cid, pod, conf, ifname="eth0", rss_file=None):
        return super().call(binary, command, cid, pod, dict(conf, **self.keys), ifname, rss_file)


# --- scenarios -----------------------------------------------------------------------


def net_conf(scn, suite, data):
    ranges = [[{"subnet": SUBNET4}]]
    if scn["dual"]:
        ranges.append([{"subnet": SUBNET6}])
    slug = "".join(c if c.isalnum() else "-" for c in scn["name"])
    conf = {"cniVersion": "1.0.0", "name": f"bench-{slug}-{suite}", "type": "bridge",
            "bridge": BRIDGE, "isDefaultGateway": True,
            "ipam": {"type": "host-local", "dataDir": data, "ranges": ranges}}
    if scn["masq"]:
        conf["ipMasq"] = True
        conf["ipMasqBackend"] = scn["masq"]
    return conf


def pod_ip4(i):
    n = i + 2
    return f"10.123.{n // 256}.{n % 256}"


class Floor:
    """The kernel floor: the same links, addresses and routes made with `ip -batch`."""

    name = "floor"

    def setup(self, host, dual):
        enter(host)
        try:
            sh(["ip", "-batch", "-"], f"link add {BRIDGE} type bridge\n"
               f"addr add {GW4}/{PREFIX4} dev {BRIDGE}\n"
               + (f"addr add {GW6}/{PREFIX6} dev {BRIDGE} nodad\n" if dual else "")
               + f"link set {BRIDGE} up\n")
        finally:
            enter(None)

    def add(self, i, pod, dual, host):
        host_cmds = (f"link add fv{i} type veth peer name eth0 netns {pod}\n"
                     f"link set fv{i} master {BRIDGE} up\n").encode()
        pod_cmds = (f"addr add {pod_ip4(i)}/{PREFIX4} dev eth0\n"
                    + (f"addr add fd00:123::{i + 2:x}/{PREFIX6} dev eth0 nodad\n" if dual else "")
                    + "link set eth0 up\n"
                    + f"route add default via {GW4} dev eth0\n"
                    + (f"route add ::/0 via {GW6} dev eth0\n" if dual else "")).encode()
        ok1, ms1, out1 = timed(["ip", "-batch", "-"], None, host_cmds)
        if not ok1:
            return ok1, ms1, out1
        # The plugins' end state has no IPv6 DAD on the pod's interface (the reference's
        # default), so the kernel's IPv6 traffic at link-up (flooded to every port of the
        # bridge) starts inside the timed window; with DAD it would start a second later,
        # outside it. Written by this process (timed; its CPU time is a few µs).
        t0 = time.perf_counter_ns()
        enter(pod)
        try:
            with open("/proc/sys/net/ipv6/conf/eth0/accept_dad", "w") as f:
                f.write("0")
        finally:
            enter(host)
        dad_ms = (time.perf_counter_ns() - t0) / 1e6
        ok2, ms2, out2 = timed(["ip", "-n", pod, "-batch", "-"], None, pod_cmds)
        return ok2, (ms1[0] + dad_ms + ms2[0], ms1[1] + ms2[1]), out2

    def delete(self, i):
        return timed(["ip", "link", "del", f"fv{i}"])


def run_pods(suite, host, scn, conf, first, count, samples, errors, check=True):
    """ADD all pods, then CHECK all, then DEL all; appends (op, index, ms)."""
    pods = [f"{TAG}-{suite.name[:2]}{i}" for i in range(first, first + count)]
    for p in pods:
        ns_add(p)
    results = {}
    enter(host)
    try:
        for i, p in zip(range(first, first + count), pods):
            if isinstance(suite, Floor):
                ok, ms, out = suite.add(i, p, scn["dual"], host)
            else:
                ok, ms, out = suite.call("bridge", "ADD", f"ctr{i}", p, conf)
                if ok:
                    results[i] = json.loads(out)
            record("ADD", i, ok, ms, out, samples, errors)
        if check and not isinstance(suite, Floor):
            for i, p in zip(range(first, first + count), pods):
                if i in results:
                    c = dict(conf, prevResult=results[i])
                    ok, ms, out = suite.call("bridge", "CHECK", f"ctr{i}", p, c)
                    record("CHECK", i, ok, ms, out, samples, errors)
        for i, p in zip(range(first, first + count), pods):
            if isinstance(suite, Floor):
                ok, ms, out = suite.delete(i)
            else:
                c = dict(conf, prevResult=results[i]) if i in results else conf
                ok, ms, out = suite.call("bridge", "DEL", f"ctr{i}", p, c)
            record("DEL", i, ok, ms, out, samples, errors)
    finally:
        enter(None)
        ns_del(pods)


def record(op, i, ok, ms, out, samples, errors):
    if ok:
        samples.append((op, i, ms))
    else:
        errors.append(f"{op} pod {i}: {out.decode(errors='replace').strip()[:500]}")


def scenario_host(suite, scn, data_root):
    host = f"{TAG}-{suite.name[:2]}h"
    ns_add(host)
    data = tempfile.mkdtemp(dir=data_root)
    conf = net_conf(scn, suite.name, data)
    if isinstance(suite, Floor):
        suite.setup(host, scn["dual"])
    if getattr(suite, "policy_table", False):
        sh(["ip", "netns", "exec", host, "nft", "-f", "-"],
           "table inet cni_node_policy {\n set pending4 { type ipv4_addr; }\n"
           " set pending6 { type ipv6_addr; }\n}\n")
    return host, conf


def run_sequential(scn, suites, rounds, per_round, data_root, rows, raw):
    """Per-op latency, suites alternating round by round (order rotated each round)."""
    state = {}
    for s in suites:
        host, conf = scenario_host(s, scn, data_root)
        # Warm-up pod (not recorded): creates the bridge and the masquerade chains,
        # pulls the binaries into the page cache.
        run_pods(s, host, scn, conf, 0, 1, [], [])
        state[s.name] = (host, conf, [], [])
    for r in range(rounds):
        order = suites[r % len(suites):] + suites[:r % len(suites)]
        for s in order:
            host, conf, samples, errors = state[s.name]
            run_pods(s, host, scn, conf, 1 + r * per_round, per_round, samples, errors)
    for s in suites:
        host, conf, samples, errors = state[s.name]
        ns_del([host])
        summarize(scn["name"], s.name, samples, errors, rows, raw)


def run_interleaved_scale(scn, suites, pods, data_root, rows, raw, window, dels=False):
    """Many pods on one bridge per suite, the suites' calls interleaved pod by pod (the
    order reversed every other pod, so that the machine's load and drift fall alike on
    every suite); compares the first and last window of ADDs (and of DELs with `dels`)."""
    state = []
    for s in suites:
        host, conf = scenario_host(s, scn, data_root)
        state.append((s, host, conf, [], []))
    try:
        for op in ("ADD", "DEL"):
            for i in range(pods):
                order = state if i % 2 == 0 else state[::-1]
                for s, host, conf, samples, errors in order:
                    pod = f"{TAG}-{s.name[:2]}{i}"
                    if op == "ADD":
                        ns_add(pod)
                    enter(host)
                    try:
                        if isinstance(s, Floor):
                            ok, ms, out = (s.add(i, pod, scn["dual"], host) if op == "ADD"
                                           else s.delete(i))
                        else:
                            ok, ms, out = s.call("bridge", op, f"ctr{i}", pod, conf)
                    finally:
                        enter(None)
                    record(op, i, ok, ms, out, samples, errors)
                    if op == "DEL":
                        ns_del([pod])
    finally:
        for s, host, *_ in state:
            ns_del([f"{TAG}-{s.name[:2]}{i}" for i in range(pods)] + [host])
    for s, _, _, samples, errors in state:
        parts = []
        for op in ("ADD", "DEL") if dels else ("ADD",):
            done = sorted((x for x in samples if x[0] == op), key=lambda x: x[1])
            parts += [(f"{op} first", done[:window]), (f"{op} last", done[-window:])]
        for label, part in parts:
            summarize(scn["name"], s.name, [(label, x[1], x[2]) for x in part],
                      [], rows, raw, ops=(label,))
        if errors:
            rows.append(error_row(scn["name"], s.name, errors))


def run_concurrent(scn, suites, pods, width, data_root, conc_rows):
    """pods ADDs `width` at a time, then as many DELs; wall time, errors, duplicates."""
    for s in suites:
        host, conf = scenario_host(s, scn, data_root)
        names = [f"{TAG}-{s.name[:2]}c{i}" for i in range(pods)]
        for n in names:
            ns_add(n)
        results, errors = {}, []

        def one(i, command):
            c = dict(conf, prevResult=results[i]) if command == "DEL" and i in results else conf
            ok, ms, out = s.call("bridge", command, f"conc{i}", names[i], c)
            return i, ok, out

        walls = {}
        for command in ("ADD", "DEL"):
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(
                    max_workers=width, initializer=enter, initargs=(host,)) as pool:
                for i, ok, out in pool.map(lambda i: one(i, command), range(pods)):
                    if not ok:
                        errors.append(f"{command} pod {i}: {out.decode(errors='replace')[:300]}")
                    elif command == "ADD":
                        results[i] = json.loads(out)
            walls[command] = time.perf_counter() - t0
        addrs = [ip["address"] for r in results.values() for ip in r.get("ips", [])]
        dups = len(addrs) - len(set(addrs))
        leftover = sh(["ip", "-n", host, "-o", "link", "show", "type", "veth"]).strip()
        ns_del(names + [host])
        conc_rows.append({"suite": s.name, "pods": pods, "width": width,
                          "add_wall_s": round(walls["ADD"], 3),
                          "del_wall_s": round(walls["DEL"], 3),
                          "errors": len(errors), "duplicates": dups,
                          "veths_left": len(leftover.splitlines()) if leftover else 0})
        for e in errors[:3]:
            log(f"  {s.name} concurrent error: {e}")


def run_rss_sizes(suites, reps, data_root, size_rows):
    """Each binary's size, and its peak RSS over ADD, CHECK and DEL (under GNU time)."""
    scn = {"name": "rss", "dual": True, "masq": "iptables"}
    rss_file = os.path.join(data_root, "rss")
    for s in suites:
        host, conf = scenario_host(s, scn, data_root)
        conf = dict(conf, ipMasqBackend="iptables")
        ipam = {"cniVersion": "1.0.0", "name": conf["name"] + "-ipam", "ipam": conf["ipam"]}
        lo = {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}
        pods = [f"{TAG}-{s.name[:2]}r{i}" for i in range(reps)]
        for p in pods:
            ns_add(p)
        peaks, failed = {"bridge": 0, "host-local": 0, "loopback": 0}, []

        def measure(binary, command, cid, pod, c, ifname="eth0"):
            ok, _, out = s.call(binary, command, cid, pod, c, ifname, rss_file)
            if not ok:
                failed.append(f"{binary} {command}: {out.decode(errors='replace')[:300]}")
                return None
            with open(rss_file) as f:
                peaks[binary] = max(peaks[binary], int(f.read().split()[-1]))
            return json.loads(out) if out.strip() else None

        enter(host)
        try:
            for i, pod in enumerate(pods):
                for binary, c, ifname in (("bridge", conf, "eth0"), ("host-local", ipam, "eth1"),
                                          ("loopback", lo, "lo")):
                    cid = f"rss{i}"
                    res = measure(binary, "ADD", cid, pod, c, ifname)
                    withprev = dict(c, prevResult=res) if res else c
                    measure(binary, "CHECK", cid, pod, withprev, ifname)
                    measure(binary, "DEL", cid, pod, withprev, ifname)
        finally:
            enter(None)
            ns_del(pods + [host])
        for e in failed[:3]:
            log(f"  {s.name} rss error: {e}")
        seen = {}  # (dev, inode) -> first name: hard links of one multi-call file
        for b in ("bridge", "host-local", "loopback"):
            path = os.path.join(s.bindir, b)
            st = os.stat(path)
            same_as = seen.setdefault((st.st_dev, st.st_ino), b)
            size_rows.append({"suite": s.name, "binary": b, "bytes": st.st_size,
                              "same_file_as": "" if same_as == b else same_as,
                              "peak_rss_kib": peaks[b],
                              "errors": sum(f.startswith(b + " ") for f in failed)})


# --- statistics and output -----------------------------------------------------------


def pct(values, p):
    v = sorted(values)
    if not v:
        return float("nan")
    k = max(0, min(len(v) - 1, math.ceil(p / 100 * len(v)) - 1))  # nearest rank
    return v[k]


def summarize(scn, suite, samples, errors, rows, raw, ops=("ADD", "CHECK", "DEL")):
    for op in ops:
        ms = [x[2] for x in samples if x[0] == op]
        for x in samples:
            if x[0] == op:
                raw.append((scn, suite, op, x[1], round(x[2][0], 3), round(x[2][1], 3)))
        if not ms:
            continue
        wall, cpu = [m[0] for m in ms], [m[1] for m in ms]
        rows.append({"scenario": scn, "op": op, "suite": suite, "n": len(ms),
                     "p50_ms": round(pct(wall, 50), 2), "p99_ms": round(pct(wall, 99), 2),
                     "mean_ms": round(sum(wall) / len(wall), 2),
                     "cpu_p50_ms": round(pct(cpu, 50), 2),
                     "errors": 0})
    if errors:
        rows.append(error_row(scn, suite, errors))


def error_row(scn, suite, errors):
    for e in errors[:3]:
        log(f"  {scn}/{suite} error: {e}")
    return {"scenario": scn, "op": "errors", "suite": suite, "n": len(errors),
            "p50_ms": "", "p99_ms": "", "mean_ms": "", "cpu_p50_ms": "",
            "errors": len(errors)}


def ratio(a, b):
    return f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else "-"


def print_tables(rows, conc_rows, size_rows, meta):
    get = {(r["scenario"], r["op"], r["suite"]): r for r in rows}
    keys = []
    for r in rows:
        if r["op"] != "errors" and (r["scenario"], r["op"]) not in keys:
            keys.append((r["scenario"], r["op"]))

    def cell(scn, op, suite, field):
        r = get.get((scn, op, suite))
        return r[field] if r else None

    print(f"\n{meta}\n")
    print("Wall ms per call (p50, p99) and CPU ms of the process tree (p50):\n")
    print("| scenario | op | ours p50 | ours p99 | ref p50 | ref p99 | floor p50 | floor p99 "
          "| ours/ref p50 | ours/floor p50 | CPU ours | CPU ref | CPU floor |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    for scn, op in keys:
        o50, o99 = cell(scn, op, "ours", "p50_ms"), cell(scn, op, "ours", "p99_ms")
        r50, r99 = cell(scn, op, "ref", "p50_ms"), cell(scn, op, "ref", "p99_ms")
        f50, f99 = cell(scn, op, "floor", "p50_ms"), cell(scn, op, "floor", "p99_ms")
        print(f"| {scn} | {op} | {fmt(o50)} | {fmt(o99)} | {fmt(r50)} | {fmt(r99)} "
              f"| {fmt(f50)} | {fmt(f99)} | {ratio(o50, r50)} | {ratio(o50, f50)} "
              f"| {fmt(cell(scn, op, 'ours', 'cpu_p50_ms'))} "
              f"| {fmt(cell(scn, op, 'ref', 'cpu_p50_ms'))} "
              f"| {fmt(cell(scn, op, 'floor', 'cpu_p50_ms'))} |")
    nm = [(op, cell("ipMasq nftables", op, "ours", "p50_ms"),
           cell("ipMasq nftables", op, NO_MASQ, "p50_ms"),
           cell("ipMasq nftables", op, "ours", "mean_ms"),
           cell("ipMasq nftables", op, NO_MASQ, "mean_ms")) for op in ("ADD", "DEL")]
    if all(v is not None for x in nm for v in x[1:]):
        print("\nipMasq nftables beside ours without masquerade (same run, rounds "
              "alternating), wall ms:\n")
        print("| op | with p50 | without p50 | added p50 | with mean | without mean "
              "| added mean |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for op, w50, o50, wm, om in nm:
            print(f"| {op} | {fmt(w50)} | {fmt(o50)} | {w50 - o50:+.2f} | {fmt(wm)} "
                  f"| {fmt(om)} | {wm - om:+.2f} |")
    for suite, what in (("ps", "portSecurity"),
                        ("pr", "podRecordDir (records, and pending addresses in a "
                               "NetworkPolicy table)"),
                        ("pn", "podRecordDir (records; no NetworkPolicy table)")):
        with_keys = [(r["scenario"], r["op"]) for r in rows if r["suite"] == suite]
        if not with_keys:
            continue
        print(f"\n{what}: our ADD with it against without it, pods interleaved, "
              "wall ms p50 (p99):\n")
        print("| scenario | op | without | with | with/without p50 |")
        print("|---|---|---:|---:|---:|")
        for scn, op in with_keys:
            o50, o99 = cell(scn, op, "ours", "p50_ms"), cell(scn, op, "ours", "p99_ms")
            p50, p99 = cell(scn, op, suite, "p50_ms"), cell(scn, op, suite, "p99_ms")
            print(f"| {scn} | {op} | {fmt(o50)} ({fmt(o99)}) | {fmt(p50)} ({fmt(p99)}) "
                  f"| {ratio(p50, o50)} |")
    errs = [r for r in rows if r["op"] == "errors"]
    for r in errs:
        print(f"\nerrors: {r['scenario']}/{r['suite']}: {r['n']}")
    if conc_rows:
        print("\n| concurrent | pods | at a time | ADD wall s | DEL wall s | errors "
              "| duplicate addresses | veths left |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for c in conc_rows:
            print(f"| {c['suite']} | {c['pods']} | {c['width']} | {c['add_wall_s']:.2f} "
                  f"| {c['del_wall_s']:.2f} | {c['errors']} | {c['duplicates']} "
                  f"| {c['veths_left']} |")
        o = next((c for c in conc_rows if c["suite"] == "ours"), None)
        f = next((c for c in conc_rows if c["suite"] == "ref"), None)
        if o and f:
            print(f"\nconcurrent ADD wall ours/ref: {ratio(o['add_wall_s'], f['add_wall_s'])}, "
                  f"DEL wall ours/ref: {ratio(o['del_wall_s'], f['del_wall_s'])}")
    print("\n| suite | binary | size KiB | peak RSS KiB |")
    print("|---|---|---:|---:|")
    for s in size_rows:
        note = " (bridge or its IPAM child)" if s["binary"] == "bridge" else ""
        size = f"{s['bytes'] / 1024:.0f}"
        if s.get("same_file_as"):
            size += f" (the same file as {s['same_file_as']})"
        print(f"| {s['suite']} | {s['binary']} | {size} "
              f"| {s['peak_rss_kib']}{note} |")


def chart(rows, path, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = []
    for r in rows:
        if r["op"] != "errors" and (r["scenario"], r["op"]) not in keys:
            keys.append((r["scenario"], r["op"]))
    get = {(r["scenario"], r["op"], r["suite"]): r for r in rows if r["op"] != "errors"}
    suites = [("ours", "#1f77b4"), ("ref", "#ff7f0e"), ("floor", "#7f7f7f")]
    fig, (wall_ax, cpu_ax) = plt.subplots(2, 1, figsize=(12, 6.5), dpi=80, sharex=True)
    width = 0.27
    top = 0.0
    for k, (suite, color) in enumerate(suites):
        xs, p50, p99, cpu = [], [], [], []
        for j, (scn, op) in enumerate(keys):
            r = get.get((scn, op, suite))
            if r:
                xs.append(j + (k - 1) * width)
                p50.append(r["p50_ms"])
                p99.append(r["p99_ms"])
                cpu.append(r["cpu_p50_ms"])
        top = max([top] + p50)
        wall_ax.bar(xs, p50, width, color=color, label=suite)
        wall_ax.plot(xs, p99, "_", color="black", markersize=6)
        cpu_ax.bar(xs, cpu, width, color=color, label=suite)
    # p99 marks above the axis would squash the p50 bars; they are in the table and CSV.
    wall_ax.set_ylim(0, top * 1.8)
    wall_ax.set_ylabel("wall ms (bar p50, dash p99)")
    cpu_ax.set_ylabel("CPU ms of the process tree, p50")
    cpu_ax.set_xticks(range(len(keys)))
    cpu_ax.set_xticklabels([f"{s.replace(' ', chr(10))}\n{o}" for s, o in keys], fontsize=7)
    wall_ax.set_title(meta, fontsize=8)
    wall_ax.legend(fontsize=8)
    for ax in (wall_ax, cpu_ax):
        ax.grid(axis="y", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(path)


def write_csv(path, rows):
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


def machine():
    """The machine in one line: CPU, CPUs, memory, kernel."""
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "unknown memory"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
                break
    return f"{cpu}, {os.cpu_count()} CPUs, {mem}, kernel {platform.release()}"


def commit():
    """The commit the run measured (with "+changes" when the tree differs from it)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def write_run_info(out, started, load0, load1, scale, smoke):
    """machine.txt: what write-docs.py says about the run (key: value lines)."""
    with open(os.path.join(out, "machine.txt"), "w") as f:
        f.write(f"run: {'smoke' if smoke else 'full'}\n")
        f.write(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}\n")
        f.write(f"machine: {machine()}\n")
        f.write(f"commit: {commit()}\n")
        f.write(f"load: {load0[0]:.1f} at the start, {load1[0]:.1f} at the end\n")
        f.write(f"duration: {time.time() - started:.0f} s\n")
        f.write(f"scale: {scale}\n")


def figures_path(out, bench):
    return os.path.join(out, "figures", f"{bench}.tsv")


def start_figures(out, bench):
    """Empties the bench's figures file, so that a run that stops early leaves no old
    figure behind for judge.py."""
    path = figures_path(out, bench)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()


def write_figures(out, bench, figures):
    """`<bench>.<figure><TAB><value>` lines for judge.py; None (not measured) is left out,
    which judge.py counts as a miss."""
    with open(figures_path(out, bench), "w") as f:
        for name, value in figures.items():
            if value is not None and math.isfinite(value):
                f.write(f"{bench}.{name}\t{value:.6g}\n")


def quotient(a, b):
    if a is None or b is None or b <= 0 or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b


def plugin_figures(rows, conc_rows, size_rows, scale_name, ps_name, smoke):
    """The figures targets.toml judges, from the run's summary rows.

    A full run's latency figures are of wall time, as the docs state them. A smoke run's
    are of CPU time of the process tree: on a machine shared with builds (load averages
    of 5 to 12 on 2 CPUs while this was written) wall time moves by multiples from call
    to call, CPU time by a few percent, and a slowdown of our own work still shows in it.
    """
    get = {(r["scenario"], r["op"], r["suite"]): r for r in rows if r["op"] != "errors"}

    def f(scn, op, suite, field):
        if smoke:
            field = "cpu_p50_ms"
        r = get.get((scn, op, suite))
        return float(r[field]) if r else None

    figs = {}
    for key, scn in (("ipv4", "ipv4"), ("dual", "dual-stack")):
        figs[f"{key}_add_vs_ref"] = quotient(f(scn, "ADD", "ours", "p50_ms"),
                                             f(scn, "ADD", "ref", "p50_ms"))
        figs[f"{key}_add_vs_floor"] = quotient(f(scn, "ADD", "ours", "p50_ms"),
                                               f(scn, "ADD", "floor", "p50_ms"))
        figs[f"{key}_check_vs_ref"] = quotient(f(scn, "CHECK", "ours", "p50_ms"),
                                               f(scn, "CHECK", "ref", "p50_ms"))
    # DEL by the mean: a veth's deletion lands on one of two kernel ticks 4 ms apart.
    for key, scn in (("ipv4", "ipv4"), ("dual", "dual-stack"),
                     ("masq_iptables", "ipMasq iptables"), ("masq_nftables", "ipMasq nftables")):
        figs[f"{key}_del_vs_floor"] = quotient(f(scn, "DEL", "ours", "mean_ms"),
                                               f(scn, "DEL", "floor", "mean_ms"))
    scn = "ipMasq iptables"
    figs["masq_iptables_add_vs_ref"] = quotient(f(scn, "ADD", "ours", "p50_ms"),
                                                f(scn, "ADD", "ref", "p50_ms"))
    figs["masq_iptables_del_vs_ref"] = quotient(f(scn, "DEL", "ours", "mean_ms"),
                                                f(scn, "DEL", "ref", "mean_ms"))
    scn = "ipMasq nftables"
    for op, field in (("ADD", "p50_ms"), ("DEL", "mean_ms")):
        a, b = f(scn, op, "ours", field), f(scn, op, NO_MASQ, field)
        figs[f"masq_nftables_{op.lower()}_extra_ms"] = None if a is None or b is None else a - b
    for end in ("first", "last"):
        figs[f"pods250_add_{end}_vs_floor"] = quotient(
            f(scale_name, f"ADD {end}", "ours", "p50_ms"),
            f(scale_name, f"ADD {end}", "floor", "p50_ms"))
    # Recorded, not judged: the growth from the first pods to the last, each suite's.
    for suite in ("ours", "ref", "floor"):
        figs[f"pods250_add_growth_{suite}"] = quotient(
            f(scale_name, "ADD last", suite, "p50_ms"), f(scale_name, "ADD first", suite, "p50_ms"))
    o = next((c for c in conc_rows if c["suite"] == "ours"), None)
    r = next((c for c in conc_rows if c["suite"] == "ref"), None)
    if o:
        figs["concurrent_errors"] = float(o["errors"])
        figs["concurrent_duplicates"] = float(o["duplicates"])
        figs["concurrent_veths_left"] = float(o["veths_left"])
    if o and r:
        figs["concurrent_add_wall_vs_ref"] = quotient(o["add_wall_s"], r["add_wall_s"])
        figs["concurrent_del_wall_vs_ref"] = quotient(o["del_wall_s"], r["del_wall_s"])
    ours_sizes = [s for s in size_rows if s["suite"] == "ours"]
    if ours_sizes and all(s["errors"] == 0 for s in ours_sizes):
        figs["peak_rss_mib"] = max(s["peak_rss_kib"] for s in ours_sizes) / 1024
    bridge = next((s for s in ours_sizes if s["binary"] == "bridge"), None)
    if bridge:
        figs["binary_bytes"] = float(bridge["bytes"])
    for end in ("first", "last"):
        figs[f"portsecurity_{end}_vs_without"] = quotient(
            f(ps_name, f"ADD {end}", "ps", "p50_ms"), f(ps_name, f"ADD {end}", "ours", "p50_ms"))
    return figs


def record_figures(rows, pr_name):
    """podRecordDir's figures: recorded, no target (docs/performance.md#podrecorddir)."""
    get = {(r["scenario"], r["op"], r["suite"]): r for r in rows if r["op"] != "errors"}
    figs = {}
    for end in ("first", "last"):
        base = get.get((pr_name, f"ADD {end}", "ours"))
        for suite, key in (("pr", "table"), ("pn", "no_table")):
            r = get.get((pr_name, f"ADD {end}", suite))
            figs[f"podrecord_{end}_{key}_vs_without"] = quotient(
                r and float(r["p50_ms"]), base and float(base["p50_ms"]))
    return figs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", "--quick", action="store_true",
                    help="reduced scale (tests/bench/check.sh --smoke)")
    a = ap.parse_args()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(130))
    os.makedirs(a.out, exist_ok=True)
    data_root = tempfile.mkdtemp(prefix="cni-bench-")
    ours, ref, floor = Plugins("ours", a.ours), Plugins("ref", a.ref), Floor()
    # The smoke scale: enough samples per cell that the ratios' noise stays inside the
    # smoke bounds of targets.toml, few enough that the whole run takes about a minute.
    # Smoke rounds are of one pod per suite, so the suites alternate pod by pod and a
    # burst of the machine's load falls on all of them alike.
    if a.smoke:
        rounds, per_round, scale_pods, window, conc_pods, width = 16, 1, 40, 10, 48, 8
        ps_pods = 40
    else:
        rounds, per_round, scale_pods, window, conc_pods, width = 5, 15, 250, 50, 200, 16
        ps_pods = 200
    rounds = int(os.environ.get("BENCH_ROUNDS", rounds))
    per_round = int(os.environ.get("BENCH_PODS", per_round))
    only = [w.strip() for w in os.environ.get("BENCH_ONLY", "").split(",") if w.strip()]

    def wanted(name):
        """BENCH_ONLY=ipv4,nftables,... runs only the parts whose names contain a word."""
        return not only or any(w in name for w in only)

    start_figures(a.out, "plugins")
    load0 = os.getloadavg()
    started = time.time()
    rows, raw, conc_rows, size_rows = [], [], [], []
    try:
        scenarios = [
            ({"name": "ipv4", "dual": False, "masq": None}, [ours, ref, floor]),
            ({"name": "dual-stack", "dual": True, "masq": None}, [ours, ref, floor]),
            ({"name": "ipMasq iptables", "dual": False, "masq": "iptables"}, [ours, ref, floor]),
            # The reference (1.1.1) has no nftables backend: ours only, and ours without
            # masquerade beside it, so that what masquerade adds is measured side by side.
            ({"name": "ipMasq nftables", "dual": False, "masq": "nftables"},
             [ours, floor, WithKeys(NO_MASQ, a.ours, {"ipMasq": False})]),
        ]
        for scn, suites in (x for x in scenarios if wanted(x[0]["name"])):
            log(f"== {scn['name']}: {rounds} rounds x {per_round} pods per suite")
            run_sequential(scn, suites, rounds, per_round, data_root, rows, raw)
        scn = {"name": f"{scale_pods} pods ipMasq", "dual": False, "masq": "iptables"}
        if wanted(scn["name"]):
            log(f"== {scn['name']} (first {window} vs last {window})")
            run_interleaved_scale(scn, [ours, ref, floor], scale_pods, data_root, rows, raw,
                                  window, dels=True)
        scn = {"name": f"portSecurity {ps_pods} pods dual-stack", "dual": True, "masq": None}
        if wanted(scn["name"]):
            log(f"== {scn['name']} (ours without and with it, first {window} vs last {window})")
            with_ps = WithKeys("ps", a.ours, {"portSecurity": True})
            run_interleaved_scale(scn, [ours, with_ps], ps_pods, data_root, rows, raw, window)
        scn = {"name": f"podRecordDir {ps_pods} pods dual-stack", "dual": True, "masq": None}
        if wanted(scn["name"]):
            log(f"== {scn['name']} (ours without and with it, first {window} vs last {window})")
            # What containerd passes: the baseline gets it too, so that only the key differs.
            k8s = ("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-0;"
                   "K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID=y")
            records = os.path.join(data_root, "pods")
            base = WithKeys("ours", a.ours, {}, cni_args=k8s)
            held = WithKeys("pr", a.ours, {"podRecordDir": records + "-pr"}, cni_args=k8s,
                            policy_table=True)
            unheld = WithKeys("pn", a.ours, {"podRecordDir": records + "-pn"}, cni_args=k8s)
            run_interleaved_scale(scn, [base, held, unheld], ps_pods, data_root, rows, raw,
                                  window)
        scn = {"name": "concurrent", "dual": False, "masq": "iptables"}
        if wanted(scn["name"]):
            log(f"== {conc_pods} pods {width} at a time (ipMasq iptables)")
            run_concurrent(scn, [ours, ref], conc_pods, width, data_root, conc_rows)
        if wanted("sizes"):
            log("== binary sizes and peak RSS")
            run_rss_sizes([ours, ref], 1 if a.smoke else 5, data_root, size_rows)
    finally:
        cleanup()
        shutil.rmtree(data_root, ignore_errors=True)
    load1 = os.getloadavg()
    meta = (f"{machine()}; load average {load0[0]:.1f} at start, {load1[0]:.1f} at end; "
            f"{time.time() - started:.0f} s; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    scale = (f"{rounds} rounds x {per_round} pods per suite; {scale_pods} pods, windows of "
             f"{window}; portSecurity and podRecordDir {ps_pods} pods per network; "
             f"{conc_pods} pods {width} at a time")
    write_run_info(a.out, started, load0, load1, scale, a.smoke)
    figs = plugin_figures(rows, conc_rows, size_rows, f"{scale_pods} pods ipMasq",
                          f"portSecurity {ps_pods} pods dual-stack", a.smoke)
    figs.update(record_figures(rows, f"podRecordDir {ps_pods} pods dual-stack"))
    write_figures(a.out, "plugins", figs)
    write_csv(os.path.join(a.out, "summary.csv"), rows)
    write_csv(os.path.join(a.out, "concurrent.csv"), conc_rows)
    write_csv(os.path.join(a.out, "sizes.csv"), size_rows)
    with open(os.path.join(a.out, "samples.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "suite", "op", "pod", "ms", "cpu_ms"])
        w.writerows(raw)
    print_tables(rows, conc_rows, size_rows, meta)
    chart(rows, os.path.join(a.out, "bench.png"), meta)
    print(f"\nCSV and chart in {a.out}")
    failed = (sum(r["errors"] for r in rows) + sum(c["errors"] for c in conc_rows)
              + sum(r["errors"] for r in size_rows))
    if failed:
        log(f"error: {failed} plugin calls failed (see above); their times are left out")
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        cleanup()
        sys.exit(130)
