#!/usr/bin/env python3
"""What measuring each app's CPU costs, and whether what it measures adds up (issue 71):

- instructions per proxied request (callgrind, one Switchyard thread, instructions.py's
  two-run measure) of a plain app with `--cpu-attribution on` and `off`;
- CPU per request at a constant rate (vegeta, keep-alive, utime+stime of the router ÷
  requests), the two routers in alternated rounds;
- agreement: one router, a light app and a heavy one (answers of --heavy-bytes relayed
  from the origin) under steady load for --seconds; the CPU the router charged to the apps
  plus what it left unattributed (`GET /v1/usage`, before and after) against the
  process's own utime+stime over the same span.

    python3 bench/engines/usage.py [--requests 2000] [--rate 2000] [--seconds 20]

Needs what bench/run installs (valgrind, vegeta, nginx) and target/release's switchyard.
Prints a table for bench/USAGE.md.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run as R  # noqa: E402
import bench  # noqa: E402
import instructions as I  # noqa: E402
import filters as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SWITCHES = [("attribution on", "on"), ("attribution off", "off")]


def start(work, label, switch, wrap=(), threads=2):
    return F.start(work, label, wrap=wrap, threads=threads, extra=("--cpu-attribution", switch))


def instructions(work, backend, args):
    """The median of --repeat two-run measures per switch, alternated: a run now and then
    carries a periodic task's work (some 8k instructions a request more), so one pair alone
    can mislead by more than the 1% looked for."""
    measured = {label: [] for label, _ in SWITCHES}
    for repeat in range(args.repeat):
        for label, switch in SWITCHES[::-1] if repeat % 2 else SWITCHES:
            measured[label].append(instructions_once(work, backend, args, switch, repeat))
            print(f"{label}: {measured[label][-1]:,.0f} instructions per request", flush=True)
    return {label: statistics.median(runs) for label, runs in measured.items()}


def instructions_once(work, backend, args, switch, repeat):
    totals = []
    for requests in (0, args.requests):
        out = work / f"{switch}-{repeat}-{requests}.callgrind"
        proc, port, admin = start(work, "callgrind", switch, wrap=I.valgrind("callgrind", out), threads=1)
        try:
            F.app(admin, backend, {})
            I.prime(port, "http")
            answered = I.load(port, "http", I.FIRST_REQUESTS, args.callgrind_rate)
            if requests:
                answered += I.load(port, "http", requests, args.callgrind_rate)
        finally:
            proc.stop()
        time.sleep(0.5)
        totals.append((answered, I.total("callgrind", out, None)[0] - calibration(out)))
    (few, few_total), (many, many_total) = totals
    return (many_total - few_total) / max(many - few, 1)


def calibration(out):
    """Instructions of the poll clock's one calibration (quanta::Clock::new, at the first
    metered poll): a loop bounded in time, so of a length that differs between runs under
    valgrind by more than the 1% looked for; a start-up cost, not a request's."""
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no",
                                str(out)], capture_output=True, text=True).stdout
    for line in annotated.splitlines():
        if "quanta::Clock::new [" in line or line.rstrip().endswith("quanta::Clock::new"):
            return int(line.split()[0].replace(",", ""))
    return 0


def cpu(work, backend, args):
    routers = []
    for label, switch in SWITCHES:
        proc, port, admin = start(work, switch, switch)
        F.app(admin, backend, {})
        status, _ = bench.get(port, R.HOST)
        assert status == 200, f"{label}: {status}"
        routers.append((label, port, proc))
    try:
        runs = bench.cpu_per_request(routers, lambda port: f"GET http://127.0.0.1:{port}/\nHost: {R.HOST}\n",
                                     args.rate, args.seconds // 2, args.rounds, "cpu")
    finally:
        for _, _, proc in routers:
            proc.stop()
    return {label: statistics.median(r["cpu_ms"] for r in runs[label]) * 1000 for label in runs}


def process_cpu_s(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def charged_s(admin):
    usage = F.admin_call(admin, "GET", "/v1/usage")
    apps = {a["app"]: a["cpu_seconds"] for a in usage["apps"]}
    return apps, usage["unattributed_cpu_seconds"]


def agreement(work, backend, args):
    heavy_origin = bench.start_answer_origin(work, "heavy-origin", b"x" * args.heavy_bytes,
                                             ["Content-Type: application/octet-stream"])
    proc, port, admin = start(work, "agreement", "on")
    try:
        F.app(admin, backend, {}, name="light", host="light.test")
        F.app(admin, heavy_origin[1], {}, name="heavy", host="heavy.test")
        for host in ("light.test", "heavy.test"):
            status, _ = bench.get(port, host)
            assert status == 200, f"{host}: {status}"
        time.sleep(1.5)
        bench.wait_for_quiet()
        apps_before, unattributed_before = charged_s(admin)
        cpu_before = process_cpu_s(proc.pid)
        attacks = []
        for host, rate in (("light.test", args.rate // 2), ("heavy.test", args.heavy_rate)):
            target = f"GET http://127.0.0.1:{port}/\nHost: {host}\n"
            attacks.append(subprocess.Popen(
                [bench.VEGETA, "attack", f"-rate={rate}", f"-duration={args.seconds}s", "-timeout=5s"],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL))
            attacks[-1].stdin.write(target.encode())
            attacks[-1].stdin.close()
        for attack in attacks:
            attack.wait()
        # Each event loop reconciles its clock with its polls once a second.
        time.sleep(2.5)
        cpu_used = process_cpu_s(proc.pid) - cpu_before
        apps_after, unattributed_after = charged_s(admin)
    finally:
        proc.stop()
        heavy_origin[0].stop()
    per_app = {app: apps_after[app] - apps_before.get(app, 0.0) for app in apps_after}
    unattributed = unattributed_after - unattributed_before
    charged = sum(per_app.values()) + unattributed
    result = {"process_cpu_s": cpu_used, "charged_s": charged, "unattributed_s": unattributed,
              "apps_s": per_app, "ratio": charged / cpu_used if cpu_used else None,
              "heavy_share": per_app.get("heavy", 0.0) / max(sum(per_app.values()), 1e-9)}
    print(f"agreement: charged {charged:.3f} s (apps {per_app}, unattributed {unattributed:.3f} s) "
          f"against utime+stime {cpu_used:.3f} s: {result['ratio']:.3f}", flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--callgrind-rate", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heavy-bytes", type=int, default=256 * 1024)
    parser.add_argument("--heavy-rate", type=int, default=200)
    parser.add_argument("--skip", action="append", default=[],
                        help="instructions, cpu or agreement (repeatable)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="usage-bench-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}, {bench.machine()}")
    results = {}
    with bench.Started() as processes:
        origin, backend, _ = R.start_origin(work)
        processes.append(origin)
        if "instructions" not in args.skip:
            results["instructions"] = instructions(work, backend, args)
        if "cpu" not in args.skip:
            results["cpu_us"] = cpu(work, backend, args)
        if "agreement" not in args.skip:
            results["agreement"] = agreement(work, backend, args)
    print(json.dumps(results, indent=2))
    ins, cpu_us = results.get("instructions", {}), results.get("cpu_us", {})
    if ins or cpu_us:
        print("\n| router | instructions / request | CPU µs / request |\n|---|---|---|")
        for label, _ in SWITCHES:
            i, c = ins.get(label), cpu_us.get(label)
            print(f"| {label} | {f'{i:,.0f}' if i else '–'} | {f'{c:.1f}' if c else '–'} |")


if __name__ == "__main__":
    main()
