#!/usr/bin/env python3
"""HTTP/3 where it is meant to win, beside HTTP/2 over TLS, Switchyard's and Caddy's, in one
run on one machine: new connections, and requests on a path that loses packets.

    python3 bench/http3_network.py [--rounds 3] [--connections 300] [--requests 1000]
                                   [--loss 2]

The clients run in a network namespace made for the run, joined to the fronts by a veth
pair (MTU 1500, offloads off so that each packet is one packet to the drop rule, not a
64 KiB segment lost at once); the namespace is deleted at the end. This kernel is built
without `tc netem` (CONFIG_NET_SCH_NETEM is not set), so loss is nftables' random drop,
and no delay is added: the path's round trip is the veth's, tens of microseconds.

- New connections: `connections` requests, each on a connection of its own (a full
  handshake, no resumption), 4 at once for HTTP/3 (bench/h3_load, quinn and h3 in Rust,
  --fresh), all at once for HTTP/2 (h2load -c N -n N). The figure is the front's CPU
  (schedstat, all threads) ÷ connections, and the connections one core could take at that
  cost; the clients differ, so their own rates are not compared.
- Loss: one connection, 10 requests in flight, `requests` GETs of a 32 KiB answer, with
  no loss, then `loss`% each way (dropped in the clients' namespace); each
  request's latency (h2load --log-file; h3_load --latency-file), p50 and p99 over the
  alternated runs pooled. On one TCP connection a lost segment holds every stream behind
  it; QUIC holds only the stream whose data was lost.

Needs root (ip netns, nft), ethtool, cargo (builds bench/h3_load), target/release/switchyard,
caddy, h2load. Writes the "HTTP/3: new connections and loss" section of
bench/RESULTS.md, earlier runs kept below.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
import cache_hits  # noqa: E402
import compress  # noqa: E402
import http3  # noqa: E402

TITLE = "## HTTP/3: new connections and loss (bench/http3_network.py)"
FRONT_IP, CLIENT_IP = "10.213.0.1", "10.213.0.2"
ANSWER_BYTES = 32 * 1024
# The HTTP/3 load client: quinn and h3 in Rust (bench/h3_load), as quick per request as
# h2load is for HTTP/2; aioquic's Python client took 20 ms a request here, more than the
# loss it was to measure.
H3_LOAD = bench.ROOT / "bench" / "h3_load"


class Namespace:
    """A network namespace for the clients, joined to this one by a veth pair."""

    def __init__(self):
        self.name = f"sy-h3net-{os.getpid()}"
        self.outer, self.inner = f"syh{os.getpid() % 100000}", f"syc{os.getpid() % 100000}"

    def __enter__(self):
        run = lambda *cmd: subprocess.run(cmd, check=True)  # noqa: E731
        run("ip", "netns", "add", self.name)
        run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        run("ip", "link", "set", self.inner, "netns", self.name)
        run("ip", "addr", "add", f"{FRONT_IP}/24", "dev", self.outer)
        run("ip", "link", "set", self.outer, "up")
        run(*self.inside("ip", "addr", "add", f"{CLIENT_IP}/24", "dev", self.inner))
        run(*self.inside("ip", "link", "set", self.inner, "up"))
        run(*self.inside("ip", "link", "set", "lo", "up"))
        # Without segmentation offloads the stacks send packets of the MTU (TCP) and quinn's
        # GSO falls back to single datagrams, so the drop rule drops packets, not batches.
        for device, inside in ((self.outer, False), (self.inner, True)):
            cmd = ["ethtool", "-K", device, "tso", "off", "gso", "off", "gro", "off", "tx", "off"]
            run(*(self.inside(*cmd) if inside else cmd))
        return self

    def __exit__(self, *exc):
        subprocess.run(["ip", "netns", "del", self.name], check=False)
        subprocess.run(["ip", "link", "del", self.outer], check=False, capture_output=True)

    def inside(self, *cmd):
        return ["ip", "netns", "exec", self.name, *cmd]

    def lose(self, loss):
        """Drops `loss`% of the packets each way at random (nftables in the namespace: this
        kernel is built without netem, CONFIG_NET_SCH_NETEM)."""
        subprocess.run(self.inside("nft", "delete", "table", "inet", "loss"), check=False,
                       capture_output=True)
        if not loss:
            return
        per_mille = round(loss * 10)
        rules = f"""table inet loss {{
    chain arriving {{ type filter hook input priority 0; iifname "{self.inner}" numgen random mod 1000 < {per_mille} drop; }}
    chain leaving {{ type filter hook output priority 0; oifname "{self.inner}" numgen random mod 1000 < {per_mille} drop; }}
}}
"""
        subprocess.run(self.inside("nft", "-f", "-"), input=rules, text=True, check=True)


def build_h3_load():
    subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path",
                    str(H3_LOAD / "Cargo.toml")], check=True)


def h3_load(ns, port, work, *extra):
    out = subprocess.run(ns.inside(str(H3_LOAD / "target" / "release" / "h3-load"),
                                   "--host", FRONT_IP, "--port", str(port),
                                   "--server-name", http3.HOST, *extra),
                         check=True, capture_output=True, text=True, cwd=work).stdout
    return json.loads(out)


def h2load(ns, port, work, *extra):
    out = subprocess.run(ns.inside("h2load", *extra, "--connect-to", f"{FRONT_IP}:{port}",
                                   f"https://{http3.HOST}:{port}/"),
                         check=True, capture_output=True, text=True, cwd=work).stdout
    done = [line for line in out.splitlines() if line.startswith("requests:")]
    fields = done[0].replace(",", "").split()
    return {"answered": int(fields[7]), "failed": int(fields[9])}


def new_connections(ns, front, work, count):
    """(answered, failed) of `count` requests each on a new connection."""
    if front["protocol"] == "HTTP/3":
        result = h3_load(ns, front["port"], work, "--fresh", "--connections", "4",
                         "--requests", str(count))
    else:
        result = h2load(ns, front["port"], work, "-n", str(count), "-c", str(count), "-m", "1")
    return result["answered"], result["failed"]


def latencies(ns, front, work, count):
    """Each request's milliseconds, on one connection with 10 in flight."""
    log = Path(work) / "latencies.txt"
    log.unlink(missing_ok=True)  # h2load appends to it
    if front["protocol"] == "HTTP/3":
        result = h3_load(ns, front["port"], work, "--connections", "1", "--streams", "10",
                         "--requests", str(count), "--latency-file", str(log))
        times = [float(line) for line in log.read_text().split()]
    else:
        result = h2load(ns, front["port"], work, "-n", str(count), "-c", "1", "-m", "10",
                        "--log-file", str(log))
        # Tab-separated: start (µs since the epoch), status, µs to the end of the answer.
        rows = [line.split("\t") for line in log.read_text().splitlines() if line]
        assert all(len(row) >= 3 for row in rows), f"h2load's log: {log.read_text()[:300]!r}"
        times = [int(row[2]) / 1000 for row in rows]
    assert result["failed"] == 0 and result["answered"] == count, f"{front['name']}: {result}"
    return times


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--loss", type=float, default=2.0)
    args = parser.parse_args()
    build_h3_load()
    work = Path(tempfile.mkdtemp(prefix="http3-net-"))
    cert, key = http3.certificate(work)
    with Namespace() as ns, bench.Started() as procs:
        router, tls_port, h3_port, caddy, caddy_port = http3.start_fronts(
            work, procs, os.urandom(ANSWER_BYTES), "application/octet-stream", cert, key,
            bind=FRONT_IP)
        fronts = [
            {"name": "Switchyard HTTP/3", "protocol": "HTTP/3", "port": h3_port, "proc": router},
            {"name": "Caddy HTTP/3", "protocol": "HTTP/3", "port": caddy_port, "proc": caddy},
            {"name": "Switchyard HTTP/2", "protocol": "HTTP/2", "port": tls_port, "proc": router},
            {"name": "Caddy HTTP/2", "protocol": "HTTP/2", "port": caddy_port, "proc": caddy},
        ]
        for front in fronts:
            answered, failed = new_connections(ns, front, work, 20)
            assert answered == 20 and failed == 0, f"{front['name']}: warm-up {answered}/{failed}"
        per_connection = {front["name"]: [] for front in fronts}
        for round_ in range(args.rounds):
            for front in fronts[::-1] if round_ % 2 else fronts:
                bench.wait_for_quiet()
                before = compress.cpu_seconds(front["proc"].pid)
                answered, failed = new_connections(ns, front, work, args.connections)
                used = compress.cpu_seconds(front["proc"].pid) - before
                assert failed == 0, f"{front['name']}: {failed} of {args.connections} new connections failed"
                per = used / max(answered, 1) * 1e6
                per_connection[front["name"]].append(per)
                print(f"{front['name']}: {per:.0f} µs CPU per new connection ({answered} answered, "
                      f"{failed} failed)", flush=True)
        waits = {}
        for loss in (0, args.loss):
            ns.lose(loss)
            for front in fronts:
                waits[(front["name"], loss)] = []
            for round_ in range(args.rounds):
                for front in fronts[::-1] if round_ % 2 else fronts:
                    times = latencies(ns, front, work, args.requests)
                    waits[(front["name"], loss)].extend(times)
                    print(f"{front['name']}, {loss}% loss: p50 {percentile(times, 0.5):.1f} ms, "
                          f"p99 {percentile(times, 0.99):.1f} ms", flush=True)
    cpu = {name: statistics.median(runs) for name, runs in per_connection.items()}
    lines = [
        TITLE,
        "",
        f"{bench.measured_on()}, Caddy {http3.caddy_version()} (Debian); Switchyard at {cache_hits.commit()}. "
        f"Clients in a network namespace behind a veth pair (MTU 1500, offloads off); "
        f"{args.rounds} alternated runs.",
        "",
        f"New connections ({args.connections} a run, each one request, full handshakes; CPU of all the "
        "front's threads, schedstat, ÷ connections, median; the clients differ by protocol, "
        "so compare within a protocol):",
        "",
        "| front | CPU per new connection (µs) | ÷ Caddy, same protocol | connections/s one core takes at that cost | runs (µs) |",
        "|---|---|---|---|---|",
    ]
    for front in fronts:
        name = front["name"]
        peer = name.replace("Switchyard", "Caddy")
        ratio = f"{cpu[name] / cpu[peer]:.2f}×" if name != peer else "–"
        runs = ", ".join(f"{r:.0f}" for r in per_connection[name])
        lines.append(f"| {name} | {cpu[name]:.0f} | {ratio} | {1e6 / cpu[name]:,.0f} | {runs} |")
    lines += [
        "",
        f"Loss: one connection, 10 requests in flight, {args.requests} GETs of a {ANSWER_BYTES // 1024} KiB "
        f"answer a run; loss each way by nftables' random drop in the clients' namespace, no delay "
        "added (this kernel has no netem); request latencies of "
        f"the runs pooled ({args.rounds * args.requests} each). HTTP/3 from bench/h3_load (quinn, h3), "
        "HTTP/2 from h2load (nghttp2).",
        "",
        f"| front | p50, 0% (ms) | p99, 0% (ms) | p50, {args.loss:g}% (ms) | p99, {args.loss:g}% (ms) | p99 at {args.loss:g}% ÷ HTTP/2's, same front |",
        "|---|---|---|---|---|---|",
    ]
    for front in fronts:
        name = front["name"]
        clean, lossy = waits[(name, 0)], waits[(name, args.loss)]
        h2 = waits[(name.replace("HTTP/3", "HTTP/2"), args.loss)]
        ratio = f"{percentile(lossy, 0.99) / percentile(h2, 0.99):.2f}×" if front["protocol"] == "HTTP/3" else "–"
        lines.append(f"| {name} | {percentile(clean, 0.5):.1f} | {percentile(clean, 0.99):.1f} | "
                     f"{percentile(lossy, 0.5):.1f} | {percentile(lossy, 0.99):.1f} | {ratio} |")
    cache_hits.publish(TITLE, lines)


if __name__ == "__main__":
    main()
