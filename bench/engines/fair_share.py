#!/usr/bin/env python3
"""The fair share under saturation (issue 71, part 4): 50 quiet apps at a steady rate
beside one app that turns heavy until the router is saturated, with `--fair-share off`
and `on` (two routers, the same binary, one after the other in one run).

For each router:
- unloaded: the quiet apps alone (vegeta, --quiet-rate requests a second spread over the
  apps, keep-alive) for --seconds: each app's p99 and success rate;
- loaded: the same, while the heavy app is asked by --heavy-connections closed-loop
  connections (wrk) for answers of --heavy-bytes of text the router
  compresses (`compress`), started 2 s before the quiet load and stopped after it;
- the heavy app's share of the CPU charged over the loaded span (`GET /v1/usage`), and
  the fair share's own counts (queued, refused);
- what the fair share costs while nothing is saturated: instructions per proxied request
  of a plain app (callgrind, one thread, usage.py's measure) with it on and off.

    python3 bench/engines/fair_share.py [--seconds 20] [--quiet-rate 500]

Needs what bench/run installs (vegeta, wrk, nginx) and a build of switchyard
(--binary, target/release's by default). Prints a table for bench/FAIR_SHARE.md.
"""

import argparse
import csv
import io
import json
import random
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
import filters as F  # noqa: E402
import usage as U  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORDS = ("router tenant share queue budget answer request stage chain worker loop event "
         "compress heavy quiet platform container domain certificate").split()


def heavy_origin(work, size):
    """nginx serving one page of `size` bytes of words (text that compresses like HTML)."""
    root = work / "heavy-root"
    root.mkdir()
    rng = random.Random(71)
    text = []
    while sum(map(len, text)) < size:
        text.append(" ".join(rng.choice(WORDS) for _ in range(12)) + "\n")
    (root / "index.html").write_text("".join(text)[:size])
    port = bench.free_port()
    proc = bench.start_nginx_origin(work, "heavy-origin", f"""
    server {{ listen 127.0.0.1:{port} backlog=4096; root {root};
              location / {{ default_type text/html; }} }}""", [port],
                                     main="user root;")
    return proc, port


def start(work, switch, binary, args):
    extra = ("--fair-share", switch, "--fair-share-lag-ms", str(args.lag_ms))
    saved = bench.BIN
    bench.BIN = binary
    try:
        return F.start(work, f"fair-share-{switch}", threads=args.threads, extra=extra)
    finally:
        bench.BIN = saved


def quiet_targets(port, apps):
    return "\n".join(f"GET http://127.0.0.1:{port}/q{i}\nHost: quiet{i}.test\n" for i in range(apps))


def quiet_load(port, args):
    """Per quiet app: its p99 (ms) and success rate over one vegeta run."""
    attack = subprocess.run(
        [bench.VEGETA, "attack", f"-rate={args.quiet_rate}", f"-duration={args.seconds}s",
         "-timeout=5s", "-keepalive=true"],
        input=quiet_targets(port, args.quiet_apps).encode(), capture_output=True, check=True)
    encoded = subprocess.run([bench.VEGETA, "encode", "--to", "csv"], input=attack.stdout,
                             capture_output=True, check=True).stdout.decode()
    per_app = {}
    for row in csv.reader(io.StringIO(encoded)):
        code, latency_ns, url = int(row[1]), int(row[2]), row[10]
        per_app.setdefault(url.rsplit("/", 1)[1], []).append((code, latency_ns / 1e6))
    result = {}
    for app, answers in per_app.items():
        latencies = sorted(ms for _, ms in answers)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        ok = sum(1 for code, _ in answers if code == 200) / len(answers)
        result[app] = {"p99_ms": p99, "success": ok, "requests": len(answers)}
    return result


def summary(per_app):
    p99s = sorted(a["p99_ms"] for a in per_app.values())
    requests = sum(a["requests"] for a in per_app.values())
    ok = sum(a["success"] * a["requests"] for a in per_app.values())
    return {"apps": len(per_app), "median_p99_ms": statistics.median(p99s), "worst_p99_ms": p99s[-1],
            "success": ok / max(requests, 1), "requests": requests}


def fair_share_counts(admin):
    return {outcome: F.metric(admin, f'switchyard_fair_share_requests_total{{outcome="{outcome}"}}')
            for outcome in ("queued", "refused")}


def cpu_by_app(admin):
    usage = F.admin_call(admin, "GET", "/v1/usage")
    return {a["app"]: a["cpu_seconds"] for a in usage["apps"]}


def heavy_load(port, args, seconds):
    return subprocess.Popen(
        ["wrk", "-t", "1", "-c", str(args.heavy_connections), "-d", f"{seconds}s",
         "-H", "Host: heavy.test", "-H", "Accept-Encoding: gzip", f"http://127.0.0.1:{port}/"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def heavy_answers(output):
    """wrk's count of requests and of answers other than 2xx/3xx."""
    requests = next((line.split()[0] for line in output.splitlines() if "requests in" in line), "?")
    non_2xx = next((line.split(":")[1].strip() for line in output.splitlines()
                    if "Non-2xx" in line), "0")
    return f"{requests} answers, {non_2xx} not 2xx/3xx"


def measure(work, switch, binary, backend, heavy_port, args):
    proc, port, admin = start(work, switch, binary, args)
    try:
        for i in range(args.quiet_apps):
            F.app(admin, backend, {}, name=f"quiet{i}", host=f"quiet{i}.test")
        F.app(admin, heavy_port, {"compress": {"types": ["text/*"]}}, name="heavy", host="heavy.test")
        for host in ("quiet0.test", "heavy.test"):
            status, _ = bench.get(port, host)
            assert status == 200, f"{host}: {status}"
        bench.wait_for_quiet()
        unloaded = quiet_load(port, args)
        print(f"{switch}: unloaded {summary(unloaded)}", flush=True)
        time.sleep(2)
        cpu_before, counts_before = cpu_by_app(admin), fair_share_counts(admin)
        heavy = heavy_load(port, args, args.seconds + 4)
        time.sleep(2)
        loaded = quiet_load(port, args)
        heavy_output = heavy.communicate()[0]
        time.sleep(1.5)
        cpu_after, counts_after = cpu_by_app(admin), fair_share_counts(admin)
    finally:
        proc.stop()
    spent = {app: cpu_after[app] - cpu_before.get(app, 0.0) for app in cpu_after}
    total = sum(spent.values())
    result = {
        "unloaded": summary(unloaded),
        "loaded": summary(loaded),
        "heavy_cpu_share": spent.get("heavy", 0.0) / total if total else None,
        "charged_cpu_s": total,
        "fair_share": {k: counts_after[k] - counts_before[k] for k in counts_after},
        "heavy_answers": heavy_answers(heavy_output),
    }
    print(f"{switch}: loaded {result['loaded']}, heavy share {result['heavy_cpu_share']:.3f}, "
          f"fair share {result['fair_share']}, heavy: {result['heavy_answers']}", flush=True)
    return result


def instructions(work, backend, args):
    """usage.py's two-run callgrind measure with --fair-share on, then off."""
    measured = {}
    started_by_usage = U.start
    try:
        for switch in ("on", "off"):
            U.start = lambda work, label, _attribution, wrap=(), threads=2, switch=switch: F.start(
                work, f"{label}-{switch}", wrap=wrap, threads=threads, extra=("--fair-share", switch))
            measured[switch] = U.instructions_once(work, backend, args, "on", 0)
            print(f"fair share {switch}: {measured[switch]:,.0f} instructions per request", flush=True)
    finally:
        U.start = started_by_usage
    return measured


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", type=Path, default=bench.BIN)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--quiet-apps", type=int, default=50)
    parser.add_argument("--quiet-rate", type=int, default=500, help="requests a second, all quiet apps")
    parser.add_argument("--heavy-connections", type=int, default=64)
    parser.add_argument("--heavy-bytes", type=int, default=256 * 1024)
    parser.add_argument("--lag-ms", type=int, default=1, help="--fair-share-lag-ms (its default)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=2000, help="callgrind's requests")
    parser.add_argument("--callgrind-rate", type=int, default=200)
    parser.add_argument("--skip", action="append", default=[], help="latency or instructions")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fair-share-bench-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}, binary {args.binary}, {bench.machine()}")
    results = {}
    with bench.Started() as processes:
        origin, backend, _ = R.start_origin(work)
        processes.append(origin)
        heavy, heavy_port = heavy_origin(work, args.heavy_bytes)
        processes.append(heavy)
        saved = bench.BIN
        bench.BIN = args.binary
        try:
            if "latency" not in args.skip:
                for switch in ("off", "on"):
                    results[switch] = measure(work, switch, args.binary, backend, heavy_port, args)
            if "instructions" not in args.skip:
                results["instructions"] = instructions(work, backend, args)
        finally:
            bench.BIN = saved
    print(json.dumps(results, indent=2))
    if "instructions" in results:
        on, off = results["instructions"]["on"], results["instructions"]["off"]
        print(f"\ninstructions / request: fair share on {on:,.0f}, off {off:,.0f} "
              f"({(on - off) / off * 100:+.2f}%)")
    print("\n| fair share | quiet p99 unloaded (median / worst app) | quiet p99 loaded (median / worst) "
          "| loaded ÷ unloaded (median) | quiet success loaded | heavy app's CPU share "
          "| heavy queued / refused | heavy answers |\n|---|---|---|---|---|---|---|---|")
    for switch, r in results.items():
        if switch == "instructions":
            continue
        u, lo = r["unloaded"], r["loaded"]
        print(f"| {switch} | {u['median_p99_ms']:.1f} / {u['worst_p99_ms']:.1f} ms "
              f"| {lo['median_p99_ms']:.1f} / {lo['worst_p99_ms']:.1f} ms "
              f"| {lo['median_p99_ms'] / u['median_p99_ms']:.2f}× | {lo['success'] * 100:.2f}% "
              f"| {r['heavy_cpu_share'] * 100:.1f}% | {r['fair_share']['queued']:.0f} / "
              f"{r['fair_share']['refused']:.0f} | {r['heavy_answers']} |")


if __name__ == "__main__":
    main()
