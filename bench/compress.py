#!/usr/bin/env python3
"""What compression costs and saves: Switchyard compressing a 64 KiB page with gzip (level
5), brotli (quality 4) and zstd (level 3) beside nginx's `gzip` at the same level 5, each
also asked for the page uncompressed, in one run on one machine.

    python3 bench/compress.py [--seconds 10] [--rounds 3] [--rate 300]

Per front: CPU per request at a constant rate (vegeta over keep-alive; the scheduler's time
on a CPU of the front's threads ÷ requests — see `cpu_seconds` — alternated `rounds` times,
median), the CPU the coding adds per KiB of page (less the same front's uncompressed
request; net of the kernel time saved on the bytes not sent), and the ratio (compressed ÷
original bytes, of one answer). The page: this repository's README of 3086da1 (its long form) as HTML text, 64 KiB.
Writes the "Compression" section of bench/RESULTS.md, earlier runs kept below.
"""

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
import cache_hits  # noqa: E402

HOST = "pages.bench"
PAGE_BYTES = 64 * 1024
TITLE = "## Compression (bench/compress.py)"

def start_nginx(work, origin_port, level=5):
    port = bench.free_port()
    conf = work / f"nginx-gzip-{level}.conf"
    conf.write_text(bench.nginx_proxy_conf(work, f"nginx-gzip-{level}", f"""\
    gzip on;
    gzip_comp_level {level};
    gzip_proxied any;
    gzip_types text/html;
    gzip_min_length 1024;
    upstream origin {{ server 127.0.0.1:{origin_port}; keepalive 16; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
        }}
    }}""", main="user root;"))
    proc = bench.Process(f"nginx-gzip-{level}", ["nginx", "-c", str(conf), "-p", str(work)], work)
    bench.wait_port(port)
    return proc, port


def cpu_seconds(pid):
    """Time on a CPU of the process's and its children's threads, from the scheduler's own
    accounting (`/proc/…/task/…/schedstat`, nanoseconds). utime and stime are sampled at
    the tick: on this KVM host they charged 2.1–2.4 ms to each 64 KiB answer, nginx's and
    Switchyard's alike, where perf's samples found a tenth of that."""
    total = 0
    for p in bench.process_tree(pid):
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def answer_size(port, accept):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Host": HOST}
    if accept:
        headers["Accept-Encoding"] = accept
    conn.request("GET", "/", headers=headers)
    response = conn.getresponse()
    body = response.read()
    coding = response.getheader("Content-Encoding")
    assert (coding or "") == (accept or ""), f"asked {accept}, got {coding}"
    return len(body)


# The README as it was before it became a short front page (1,175 lines of prose): the page
# every run has compressed, the same bytes from one commit to the next.
PAGE_SOURCE = "3086da1:README.md"


def html_page():
    """`PAGE_BYTES` of English prose in Markdown, as a large HTML page reads to a compressor."""
    text = subprocess.run(["git", "-C", str(bench.ROOT), "show", PAGE_SOURCE], check=True,
                          capture_output=True).stdout
    return (text * (PAGE_BYTES // len(text) + 1))[:PAGE_BYTES]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=300)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compress-"))
    page = html_page()
    with bench.Started() as procs:
        origin, origin_port = bench.start_answer_origin(work, "origin", page, ["Content-Type: text/html"])
        procs.append(origin)
        nginx, nginx_port = start_nginx(work, origin_port)
        procs.append(nginx)
        router, router_port, admin = bench.serve_switchyard(work, "switchyard", "--threads", str(bench.THREADS))
        procs.append(router)
        bench.put_app(admin, "pages", {"domains": [HOST], "backends": [f"127.0.0.1:{origin_port}"],
                                       "compress": {"types": ["text/html"]}})
        time.sleep(0.5)
        fronts = [
            ("nginx", (nginx_port, ""), nginx),
            ("nginx gzip 5", (nginx_port, "gzip"), nginx),
            ("Switchyard", (router_port, ""), router),
            ("Switchyard gzip 5", (router_port, "gzip"), router),
            ("Switchyard br 4", (router_port, "br"), router),
            ("Switchyard zstd 3", (router_port, "zstd"), router),
        ]
        sizes = {name: answer_size(*key) for name, key, _ in fronts}
        target = lambda key: (f"GET http://127.0.0.1:{key[0]}/\nHost: {HOST}\n"
                              + (f"Accept-Encoding: {key[1]}\n" if key[1] else ""))
        cpu = {name: [] for name, _, _ in fronts}
        for round_ in range(args.rounds):
            for name, key, proc in fronts[::-1] if round_ % 2 else fronts:
                bench.wait_for_quiet()
                before = cpu_seconds(proc.pid)
                attack = subprocess.run([bench.VEGETA, "attack", f"-rate={args.rate}",
                                         f"-duration={args.seconds}s", "-timeout=5s"],
                                        input=target(key).encode(), check=True, capture_output=True).stdout
                summary = bench.vegeta_summary(attack)
                run = (cpu_seconds(proc.pid) - before) / summary["requests"] * 1e6
                cpu[name].append(run)
                print(f"page {name}: {run:.0f} µs CPU per request (success {summary['success']:.3f})",
                      flush=True)
    median = {n: statistics.median(runs) for n, runs in cpu.items()}
    kib = PAGE_BYTES / 1024
    lines = [
        TITLE,
        "",
        f"{bench.measured_on(nginx=True)}; Switchyard at "
        f"{cache_hits.commit()}. A {PAGE_BYTES // 1024} KiB HTML page (the README of 3086da1), CPU per request at "
        f"{args.rate} req/s (vegeta over keep-alive, {args.rounds} alternated runs of {args.seconds} s, "
        "median; CPU from the scheduler's accounting, schedstat); the coding's CPU is the request's less the same front's uncompressed one's. "
        "On this host sending a 64 KiB answer over loopback costs about 2 ms of CPU, nginx's and Switchyard's alike, "
        "so a coding's net cost is its own CPU less the kernel's time saved on the bytes it did not send: "
        "negative when the second is larger.",
        "",
        "| front | CPU per request (µs) | coding's CPU per KiB of page (µs) | ratio | runs (µs) |",
        "|---|---|---|---|---|",
    ]
    for name, _, _ in fronts:
        base = "nginx" if name.startswith("nginx") else "Switchyard"
        coding = f"{(median[name] - median[base]) / kib:.2f}" if name != base else "–"
        runs = ", ".join(f"{r:.0f}" for r in cpu[name])
        lines.append(f"| {name} | {median[name]:.0f} | {coding} | {sizes[name] / PAGE_BYTES:.3f} | {runs} |")
    cache_hits.publish(TITLE, lines)


if __name__ == "__main__":
    main()
