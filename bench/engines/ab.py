#!/usr/bin/env python3
"""CPU per request at a constant rate for a few proxies, in alternating rounds: the quick
check that a change left the cost of a request where it was (the full comparison is
run.py); with `--scheme h2 --closed`, HTTP/2 over TLS as fast as answered (h2load, 16
connections × 10 streams, no rate): the median req/s beside the CPU per request. Each round runs every target once, in turn, so a slow spell of this shared machine
falls on all of them; the median of the rounds is reported.

    python3 bench/engines/ab.py nginx switchyard hyper-floor [--rounds 3] [--seconds 10]
        [--rate 2000] [--scheme http|https|h2] [--closed]

Targets are run.py's (nginx, haproxy, switchyard, pingora-floor, hyper-floor, h1-floor); the floors
need `cargo build --release` in bench/engines first. Everything listens on 127.0.0.1 and
every process is stopped by its PID.
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run as R  # noqa: E402
import bench  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+", choices=sorted(R.PROXIES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--scheme", choices=["http", "https", "h2"], default="http",
                        help="h2: HTTP/2 over TLS with h2load (nginx, haproxy, switchyard)")
    parser.add_argument("--closed", action="store_true",
                        help="with --scheme h2: as fast as answered, req/s reported")
    args = parser.parse_args()
    if args.closed and args.scheme != "h2":
        parser.error("--closed measures HTTP/2 only: give --scheme h2")
    work = Path(tempfile.mkdtemp(prefix="ab-"))
    tls = R.make_certificate(work) if args.scheme in ("https", "h2") else None
    running = {}
    with bench.Started() as processes:
        origin, backend, status = R.start_origin(work)
        processes.append(origin)
        for target in args.targets:
            proxy, port = R.PROXIES[target](work, backend, tls=tls)
            processes.append(proxy)
            bench.get(port, R.HOST)
            running[target] = (proxy, port if args.scheme == "http" else proxy.tls_port)
        measured = {target: [] for target in args.targets}
        throughput = {target: [] for target in args.targets}
        for round_number in range(args.rounds):
            for target in args.targets:
                proxy, port = running[target]
                if args.closed:
                    bench.wait_for_quiet()
                    m = R.http2_closed_loop(proxy, port, args.seconds)
                    m["p99_ms"] = float("nan")
                    throughput[target].append(m["rps"])
                    print(f"round {round_number} {target}: {m['rps']:.0f} req/s, "
                          f"{m['cpu_us_per_request']:.1f} µs/request, "
                          f"{m['cpu_share']:.0%} of the cores", flush=True)
                elif args.scheme == "h2":
                    m = R.http2_constant_rate(proxy, port, args.rate, args.seconds)
                    m["p99_ms"] = float("nan")
                else:
                    m = R.constant_rate(proxy, port, status, args.rate, args.seconds, scheme=args.scheme)
                measured[target].append(m["cpu_us_per_request"])
                if not args.closed:
                    print(f"round {round_number} {target}: {m['cpu_us_per_request']:.1f} "
                          f"µs/request, p99 {m['p99_ms']:.2f} ms, answered {m['success']:.0%}",
                          flush=True)
        if args.closed:
            report(throughput, args.targets, "req/s", "{:.0f}")
        report(measured, args.targets, "µs/request", "{:.1f}")


def report(rounds, targets, unit, number):
    """Each target's median of its rounds, beside the first target's."""
    base = None
    for target in targets:
        values = sorted(rounds[target])
        median = values[len(values) // 2]
        base = base or median
        print(f"{target}: median {number.format(median)} {unit} ({median / base:.2f}× "
              f"{targets[0]}), rounds {', '.join(number.format(v) for v in rounds[target])}")

if __name__ == "__main__":
    main()
