#!/usr/bin/env python3
"""HTTP/3 beside HTTP/2 over TLS, Switchyard's and Caddy's (Debian's caddy, reverse_proxy
to the same origin), in one run on one machine: CPU per request of each front.

    python3 bench/http3.py [--requests 6000] [--rounds 3] [--connections 4] [--streams 10]

Load is closed-loop and the same shape for both protocols: `connections` connections each
keeping `streams` requests in flight until `requests` are answered — HTTP/3 by aioquic's
client (bench/h3_load.py; Debian's h2load and curl are built without HTTP/3), HTTP/2 by
h2load. The figure is the front's CPU (the scheduler's accounting of all its threads,
schedstat) ÷ requests answered, alternated `rounds` times, median. The client differs
between the protocols, so only each protocol's row pair (Switchyard ÷ Caddy) is a like-for-
like ratio. Needs target/release/switchyard, caddy, h2load, and aioquic (scripts/test's
target/h3-venv). Writes the "HTTP/3" section of bench/RESULTS.md, earlier runs kept below.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
import cache_hits  # noqa: E402
import compress  # noqa: E402

HOST = "bench.test"
TITLE = "## HTTP/3 (bench/http3.py)"
PYTHON = bench.ROOT / "target" / "h3-venv" / "bin" / "python3"


def certificate(work):
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
                    "-subj", f"/CN={HOST}", "-addext", f"subjectAltName=DNS:{HOST}"],
                   check=True, capture_output=True)
    return cert, key


def start_caddy(work, origin_port, cert, key, bind="127.0.0.1"):
    port = bench.free_port()
    caddyfile = work / "Caddyfile"
    caddyfile.write_text(f"""{{
    admin off
    auto_https off
    servers {{
        protocols h1 h2 h3
    }}
}}
https://{HOST}:{port} {{
    bind {bind}
    tls {cert} {key}
    reverse_proxy 127.0.0.1:{origin_port}
}}
""")
    proc = bench.Process("caddy", ["caddy", "run", "--config", str(caddyfile), "--adapter", "caddyfile"],
                         work, env={**os.environ, "HOME": str(work), "XDG_DATA_HOME": str(work),
                                    "XDG_CONFIG_HOME": str(work), "GOMAXPROCS": str(bench.THREADS)})
    bench.wait_port(port, host=bind)
    return proc, port


def caddy_version():
    """The Caddy the benches run beside, as `caddy version` names it."""
    return subprocess.run(["caddy", "version"], capture_output=True, text=True).stdout.split()[0]


def start_fronts(work, procs, body, content_type, cert, key, bind="127.0.0.1"):
    """An origin answering `body`, and Switchyard (HTTPS and HTTP/3) and Caddy in front of
    it on `bind`, each added to `procs`: (router, its TLS port, its HTTP/3 port, caddy, its
    port)."""
    origin, origin_port = bench.start_answer_origin(work, "origin", body,
                                                    [f"Content-Type: {content_type}"])
    procs.append(origin)
    tls_port, h3_port = bench.free_port(), bench.free_port()
    router, _, admin = bench.serve_switchyard(
        work, "switchyard", "--threads", str(bench.THREADS), "--https", f"{bind}:{tls_port}",
        "--http3", f"{bind}:{h3_port}", "--default-cert", str(cert), "--default-key", str(key),
        "--waf", "off")
    procs.append(router)
    bench.put_app(admin, "bench", {"domains": [HOST], "backends": [f"127.0.0.1:{origin_port}"]})
    caddy, caddy_port = start_caddy(work, origin_port, cert, key, bind=bind)
    procs.append(caddy)
    return router, tls_port, h3_port, caddy, caddy_port


def h3_run(port, args):
    out = subprocess.run([str(PYTHON), str(bench.ROOT / "bench" / "h3_load.py"), "--port", str(port),
                          "--server-name", HOST, "--requests", str(args.requests),
                          "--connections", str(args.connections), "--streams", str(args.streams)],
                         check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    return result["answered"], result["failed"]


def h2_run(port, args):
    out = subprocess.run(["h2load", "-n", str(args.requests), "-c", str(args.connections),
                          "-m", str(args.streams), "--connect-to", f"127.0.0.1:{port}",
                          f"https://{HOST}:{port}/"], check=True, capture_output=True, text=True).stdout
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", out)
    return int(done.group(2)), int(done.group(3))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--streams", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="http3-"))
    cert, key = certificate(work)
    with bench.Started() as procs:
        router, tls_port, h3_port, caddy, caddy_port = start_fronts(
            work, procs, b"hello from the origin\n", "text/plain", cert, key)
        fronts = [
            ("Switchyard HTTP/3", h3_run, h3_port, router),
            ("Caddy HTTP/3", h3_run, caddy_port, caddy),
            ("Switchyard HTTP/2", h2_run, tls_port, router),
            ("Caddy HTTP/2", h2_run, caddy_port, caddy),
        ]
        # The listener may still be loading certificates when the run begins: one connection
        # first, retried.
        for _ in range(5):
            try:
                h3_run(h3_port, argparse.Namespace(**{**vars(args), "requests": 1, "connections": 1}))
                break
            except subprocess.CalledProcessError:
                continue
        for name, run, port, _ in fronts:
            answered, failed = run(port, argparse.Namespace(**{**vars(args), "requests": 200}))
            assert answered == 200 and failed == 0, f"{name}: warm-up {answered} answered, {failed} failed"
        cpu = {name: [] for name, *_ in fronts}
        for round_ in range(args.rounds):
            for name, run, port, proc in fronts[::-1] if round_ % 2 else fronts:
                bench.wait_for_quiet()
                before = compress.cpu_seconds(proc.pid)
                answered, failed = run(port, args)
                used = compress.cpu_seconds(proc.pid) - before
                per = used / max(answered, 1) * 1e6
                cpu[name].append(per)
                print(f"{name}: {per:.1f} µs CPU per request ({answered} answered, {failed} failed)",
                      flush=True)
    median = {name: statistics.median(runs) for name, runs in cpu.items()}
    lines = [
        TITLE,
        "",
        f"{bench.measured_on()}, Caddy {caddy_version()}"
        f" (Debian); Switchyard at {cache_hits.commit()}. A {len(b'hello from the origin')}-byte answer through "
        f"each front; closed loop, {args.connections} connections × {args.streams} requests in flight, "
        f"{args.requests} requests a run, {args.rounds} alternated runs, median; CPU of all the front's threads "
        "(schedstat) ÷ requests answered. HTTP/3 load from aioquic's client, HTTP/2 from h2load.",
        "",
        "| front | CPU per request (µs) | ÷ Caddy, same protocol | runs (µs) |",
        "|---|---|---|---|",
    ]
    for name, *_ in fronts:
        peer = name.replace("Switchyard", "Caddy")
        ratio = f"{median[name] / median[peer]:.2f}×" if name != peer else "–"
        runs = ", ".join(f"{r:.1f}" for r in cpu[name])
        lines.append(f"| {name} | {median[name]:.1f} | {ratio} | {runs} |")
    cache_hits.publish(TITLE, lines)


if __name__ == "__main__":
    main()
