#!/usr/bin/env python3
"""What a cache hit costs: Switchyard's memory cache answering a stored 5 KB page, this build
beside an earlier one (SWITCHYARD_BEFORE_BIN, labelled SWITCHYARD_BEFORE_LABEL) and nginx's
`proxy_cache`, in the same run on the same machine.

    python3 bench/cache_hits.py [--seconds 10] [--rounds 5]

Two figures per front: CPU per hit at a constant 2,000 req/s (vegeta; utime + stime of the
front's processes ÷ requests, alternated `rounds` times, median), the steadier figure on
two shared cores; and closed-loop hit throughput (wrk -t2 -c64, `rounds` runs interleaved,
median). Every request is a hit: the page is stored first (`Cache-Control: max-age=3600`
from the origin, which both builds read). Writes the "Cache hit cost" section of
bench/RESULTS.md, keeping the figures of earlier runs below the new ones.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

HOST = "hits.bench"
PATH = "/page"
RATE = 2000
TITLE = "## Cache hit cost (bench/cache_hits.py)"
RESULTS = bench.ROOT / "bench" / "RESULTS.md"

def start_nginx(work, origin_port):
    port = bench.free_port()
    conf = work / "nginx-hits.conf"
    # user root: the workers write the cache under the run's private directory.
    conf.write_text(bench.nginx_proxy_conf(work, "nginx-hits", f"""\
    proxy_cache_path {work}/nginx-cache keys_zone=pages:10m max_size=64m;
    upstream origin {{ server 127.0.0.1:{origin_port}; keepalive 16; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_cache pages;
            proxy_cache_key $host$request_uri;
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
        }}
    }}""", main="user root;"))
    proc = bench.Process("nginx-hits", ["nginx", "-c", str(conf), "-p", str(work)], work)
    bench.wait_port(port)
    return proc, port


def start_switchyard(work, name, binary, origin_port):
    proc, port, admin = bench.serve_switchyard(work, name, "--threads", str(bench.THREADS), binary=binary)
    bench.put_app(admin, "hits", {"domains": [HOST], "backends": [f"127.0.0.1:{origin_port}"],
                                  "cache": {"paths": ["/*"]}})
    return proc, port


def machine():
    m = bench.machine()
    return f"{m['cpu']}, {m['cores']} cores, kernel {m['kernel']}, {m['versions']['nginx'].replace('nginx version: ', '')}"


def commit():
    return subprocess.run(["git", "-C", str(bench.ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def publish(title, lines):
    """Prints a script's section and puts it in bench/RESULTS.md under `title`, the
    earlier runs' tables kept below it."""
    global TITLE
    print("\n".join(lines))
    TITLE = title
    replace_section(lines)


def replace_section(lines):
    """Puts this run's section first and keeps what earlier runs measured below it."""
    text = RESULTS.read_text()
    earlier = []
    if TITLE in text:
        start = text.index(TITLE)
        end = text.find("\n## ", start + len(TITLE))
        old = text[start:end if end != -1 else len(text)].rstrip("\n").split("\n")
        earlier = [l for l in old[1:] if l.startswith("- ")]
        measured = next((l.split(",")[0].replace("Measured on ", "") for l in old
                         if l.startswith("Measured on ")), "an earlier run")
        tables = [l for l in old if l.startswith("| ") and not l.startswith("| front")]
        earlier += [f"- {measured}: {l}" for l in tables]
        text = text[:start] + text[end + 1:] if end != -1 else text[:start]
    body = lines + ([""] + earlier[:20] if earlier else [])
    RESULTS.write_text(text.rstrip("\n") + "\n\n" + "\n".join(body) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cache-hits-"))
    before = os.environ.get("SWITCHYARD_BEFORE_BIN")
    labels = {"switchyard": f"Switchyard at {commit()}"}
    if before:
        labels["switchyard-before"] = os.environ.get("SWITCHYARD_BEFORE_LABEL", f"Switchyard ({before})")
    labels["nginx"] = "nginx proxy_cache"
    with bench.Started() as procs:
        origin, origin_port = bench.start_answer_origin(
            work, "origin", b"<p>a cached page</p>" * 256,
            ["Content-Type: text/html", "Cache-Control: max-age=3600"])
        procs.append(origin)
        fronts = []
        for name in labels:
            if name == "nginx":
                proc, port = start_nginx(work, origin_port)
            else:
                binary = Path(before) if name == "switchyard-before" else bench.BIN
                proc, port = start_switchyard(work, name, binary, origin_port)
            procs.append(proc)
            for _ in range(3):
                status, _ = bench.get(port, HOST, PATH)
                assert status == 200, f"{name}: {status}"
            fronts.append((name, port, proc))
        target = lambda port: f"GET http://127.0.0.1:{port}{PATH}\nHost: {HOST}\n"
        cpu = bench.cpu_per_request(fronts, target, RATE, args.seconds, args.rounds, "hit")
        throughput = {name: [] for name, _, _ in fronts}
        for round_ in range(args.rounds):
            for name, port, _ in fronts[::-1] if round_ % 2 else fronts:
                bench.wait_for_quiet()
                rps, errors = bench.wrk_throughput(port, args.seconds, host=HOST, path=PATH)
                throughput[name].append(rps)
                print(f"hit throughput {name}: {rps:.0f} req/s {errors}", flush=True)
    median_cpu = {n: statistics.median(r["cpu_ms"] for r in runs) * 1000 for n, runs in cpu.items()}
    median_rps = {n: statistics.median(runs) for n, runs in throughput.items()}
    base = "switchyard-before" if before else "nginx"
    lines = [
        TITLE,
        "",
        f"Measured on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine()}. "
        f"A stored 5 KB page, every request a hit; CPU per hit at {RATE} req/s (vegeta, "
        f"{args.rounds} alternated runs of {args.seconds} s, median) and closed-loop hit throughput "
        f"(wrk -t2 -c64, {args.rounds} interleaved runs of {args.seconds} s, median).",
        "",
        f"| front | CPU per hit (µs) | vs {labels[base]} | hit throughput (req/s) | vs {labels[base]} | runs (µs; req/s) |",
        "|---|---|---|---|---|---|",
    ]
    for name in labels:
        runs = ", ".join(f"{r['cpu_ms'] * 1000:.1f}" for r in cpu[name])
        rps_runs = ", ".join(f"{r:.0f}" for r in throughput[name])
        lines.append(
            f"| {labels[name]} | {median_cpu[name]:.1f} | {median_cpu[name] / median_cpu[base]:.3f}× | "
            f"{median_rps[name]:.0f} | {median_rps[name] / median_rps[base]:.3f}× | {runs}; {rps_runs} |")
    print("\n".join(lines))
    replace_section(lines)


if __name__ == "__main__":
    main()
