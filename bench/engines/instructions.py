#!/usr/bin/env python3
"""Instructions and heap allocations per proxied request, under valgrind: the counts that
do not move with this shared machine's spells, beside run.py's CPU time.

    python3 bench/engines/instructions.py nginx hyper-floor h1-floor [--tool callgrind|dhat]
        [--requests 2000] [--rate 200] [--scheme http|https] [--http2]

Each target runs with one worker (nginx: `master_process off`, one worker; HAProxy: one
thread; the floors and Switchyard: `--threads 1`) under `valgrind --tool=callgrind`
(instructions executed in user space, libraries included) or `--tool=dhat` (heap blocks
and bytes allocated). It is started twice, given a few requests the first time and
`--requests` more the second (vegeta at a constant rate over keep-alive, to the same
origin as run.py's), then stopped; the difference of the two totals over the difference
of the requests answered is the per-request figure: start-up, the first connections and
shutdown cancel out. `--http2`: the requests go over HTTP/2 instead (h2load, 4 connections
× 10 streams, as fast as answered: h2load has no steady rate under valgrind's pace); with
`--scheme https` over TLS (ALPN h2: nginx, HAProxy, Switchyard), with `http` in clear with
prior knowledge (Switchyard only). Everything listens on 127.0.0.1; every process is stopped
by its PID.
Writes nothing but its own output: copy the figures to bench/ENGINE.md with the commit.
"""

import argparse
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run as R  # noqa: E402
import bench  # noqa: E402

FIRST_REQUESTS = 200


def valgrind(tool, out):
    flag = "--callgrind-out-file" if tool == "callgrind" else "--dhat-out-file"
    return ["valgrind", f"--tool={tool}", f"{flag}={out}"]


def start(name, work, backend, tool, out, tls, app_options=None):
    """run.py's own starter for `name`, with one worker and under the tool; `app_options`:
    settings added to Switchyard's app."""
    one_worker = {"workers": 1} if name == "nginx" else {"threads": 1}
    if app_options:
        one_worker["app_options"] = app_options
    proc, port = R.PROXIES[name](work, backend, tls=tls, wrap=valgrind(tool, out), **one_worker)
    return proc, port, proc.tls_port


def load(port, scheme, requests, rate, fields=()):
    """`requests` requests at `rate`/s over keep-alive; the number answered with success.
    `fields`: more request fields, as `Name: value` lines."""
    extra = "".join(f"{field}\n" for field in fields)
    target = f"GET {scheme}://127.0.0.1:{port}/\nHost: {R.HOST}\n{extra}"
    attack = subprocess.run(
        [bench.VEGETA, "attack", f"-rate={rate}", f"-duration={requests / rate}s", "-timeout=10s",
         "-keepalive=true", "-connections=8", "-workers=8", "-max-workers=8", "-http2=false",
         "-insecure"],
        input=target.encode(), check=True, capture_output=True).stdout
    summary = bench.vegeta_summary(attack)
    return int(round(summary["requests"] * summary["success"]))


def load_http2(port, scheme, requests, fields=()):
    """`requests` requests over HTTP/2 (h2load, 4 connections × 10 streams); the number
    answered 2xx."""
    extra = [arg for field in fields for arg in ("-H", field)]
    run = subprocess.run(
        ["h2load", f"-n{requests}", "-c4", "-m10", "-H", f":authority: {R.HOST}", *extra,
         f"{scheme}://127.0.0.1:{port}/"],
        check=True, capture_output=True, text=True, timeout=900).stdout
    match = re.search(r"status codes: (\d+) 2xx", run)
    if not match:
        raise RuntimeError(f"h2load said: {run[-500:]}")
    return int(match.group(1))


def prime(port, scheme, fields=()):
    """One request, waited for (its status is not judged: the load's count is)."""
    headers = {"Host": R.HOST, **dict(f.split(": ", 1) for f in fields)}
    request = urllib.request.Request(f"{scheme}://127.0.0.1:{port}/", headers=headers)
    context = ssl._create_unverified_context() if scheme == "https" else None
    try:
        with urllib.request.urlopen(request, timeout=60, context=context) as answer:
            answer.read()
    except urllib.error.HTTPError:
        pass


def total(tool, out, log):
    """The run's total: instructions (callgrind) or (bytes, blocks) allocated (dhat)."""
    if tool == "callgrind":
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return (int(line.split()[1]),)
        raise RuntimeError(f"no totals in {out}")
    match = re.search(r"Total:\s+([\d,]+) bytes in ([\d,]+) blocks", log.read_text())
    if not match:
        raise RuntimeError(f"no dhat total in {log}")
    return tuple(int(g.replace(",", "")) for g in match.groups())


def one_run(name, work, backend, args, tls, requests, app_options=None, fields=(), label=None):
    out = work / f"{label or name}-{args.tool}-{requests}.out"
    proc, port, tls_port = start(name, work, backend, args.tool, out, tls, app_options)
    try:
        serving = tls_port if args.scheme == "https" else port
        # One request alone first: what a stage does once per process (a password checked
        # on the worker pool) is then done once, not by however many of the warm-up's first
        # requests arrive before it is done, a count that differs between the two runs.
        if args.http2:
            answered = load_http2(serving, args.scheme, FIRST_REQUESTS, fields)
            if requests:
                answered += load_http2(serving, args.scheme, requests, fields)
        else:
            prime(serving, args.scheme, fields)
            # Warm-up: the first connections, pools and lazily built tables, in both runs.
            answered = load(serving, args.scheme, FIRST_REQUESTS, args.rate, fields)
            if requests:
                answered += load(serving, args.scheme, requests, args.rate, fields)
    finally:
        proc.proc.send_signal(signal.SIGTERM)
        try:
            proc.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.proc.send_signal(signal.SIGINT)
            proc.proc.wait(timeout=60)
        proc.log.close()
    time.sleep(0.5)
    return answered, total(args.tool, out, work / f"{proc.name}.log")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+", choices=sorted(R.PROXIES))
    parser.add_argument("--tool", choices=["callgrind", "dhat"], default="callgrind")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--scheme", choices=["http", "https"], default="http")
    parser.add_argument("--http2", action="store_true",
                        help="HTTP/2 with h2load (https: over TLS; http: Switchyard only)")
    args = parser.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("valgrind is missing: bench/run installs it (Debian's valgrind package)")
    work = Path(tempfile.mkdtemp(prefix="instructions-"))
    tls = R.make_certificate(work) if args.scheme == "https" else None
    rows = {}
    with bench.Started() as processes:
        origin, backend, _ = R.start_origin(work)
        processes.append(origin)
        for name in args.targets:
            few, few_total = one_run(name, work, backend, args, tls, 0)
            many, many_total = one_run(name, work, backend, args, tls, args.requests)
            per_request = [(b - a) / max(many - few, 1) for a, b in zip(few_total, many_total)]
            rows[name] = per_request
            what = ("instructions" if args.tool == "callgrind" else "bytes, blocks")
            print(f"{name}: {', '.join(f'{v:,.1f}' for v in per_request)} {what} per request "
                  f"({many - few} requests between the runs, {args.scheme}"
                  f"{', HTTP/2' if args.http2 else ''})", flush=True)
    base = rows.get("nginx")
    for name, values in rows.items():
        ratio = f" ({values[-1] / base[-1]:.2f}× nginx)" if base and base[-1] else ""
        print(f"{name}: {' / '.join(f'{v:,.0f}' for v in values)}{ratio}")


if __name__ == "__main__":
    main()
