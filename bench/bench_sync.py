#!/usr/bin/env python3
"""Declarative sync at scale (issue 68, step 4): 100,000 apps in the embedded store, a desired
set that differs in 1% of them, and `switchyard apps sync FILE` (the plan, then the plan
applied with its revision as If-Match) timed end to end; then the same set again (nothing to
change); then the routers' change-to-answer latency — a backend changed through the API
until the proxy answers from it, on apps the sync does not touch — measured before and
during a sync moving 2% (the first 1% back, another 1% over; one `PUT /v1/apps`).

    python3 bench/bench_sync.py [--apps 100000] [--rounds 3]

Everything listens on 127.0.0.1; every process is stopped by its PID. Writes the
"Declarative sync" section of bench/RESULTS.md, keeping earlier runs' lines below.
"""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

TITLE = "## Declarative sync (bench/bench_sync.py)"
RESULTS = bench.ROOT / "bench" / "RESULTS.md"
# The apps the change-to-answer probe changes: `i % 100 == PROBED`.
PROBED = 50


def desired_file(work, apps, b1, b2, changed_mod):
    """Every app as bench-seed stores it, those with `i % 100 == changed_mod` on b2; the
    probe's apps (`i % 100 == PROBED`) left out, kept as they are (no prune), since the
    probe changes them under the sync."""
    path = work / f"desired-{changed_mod}.jsonl"
    with path.open("w") as out:
        for i in range(apps):
            if i % 100 == PROBED:
                continue
            backend = b2 if i % 100 == changed_mod else b1
            out.write(json.dumps({"name": f"app{i}", "domains": [f"app{i}.bench"],
                                  "backends": [f"127.0.0.1:{backend}"], "tls": {"acme": False}}) + "\n")
    return path


def timed_cli(admin_port, *args):
    started = time.perf_counter()
    done = subprocess.run([str(bench.BIN), "apps", "sync", *args, "--admin", f"127.0.0.1:{admin_port}"],
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"sync failed: {done.stderr}")
    return elapsed, done.stdout.strip().splitlines()[-1]


def change_to_answer_ms(http_port, admin_port, i, b1, b2):
    """One backend change of app{i} (b1 → b2) until the proxy answers from it, then back."""
    host = f"app{i}.bench"
    bench.wait_for_backend(http_port, host, b"b1")
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=30)
    conn.request("PUT", f"/v1/apps/app{i}/backends", body=json.dumps({"backends": [f"127.0.0.1:{b2}"]}),
                 headers={"Content-Type": "application/json"})
    assert conn.getresponse().status == 200
    conn.close()
    bench.wait_for_backend(http_port, host, b"b2")
    took = (time.perf_counter() - start) * 1000
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=30)
    conn.request("PUT", f"/v1/apps/app{i}/backends", body=json.dumps({"backends": [f"127.0.0.1:{b1}"]}),
                 headers={"Content-Type": "application/json"})
    conn.getresponse().read()
    conn.close()
    return took


def probe(http_port, admin_port, b1, b2, until, samples, start_i, apps):
    """Change-to-answer samples on apps `i % 100 == 50` until `until()` says stop."""
    i = start_i
    while not until():
        samples.append(change_to_answer_ms(http_port, admin_port, i % apps, b1, b2))
        i += 100


def api_sync(admin_port, path):
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=120)
    conn.request("PUT", "/v1/apps", body=path.read_bytes(), headers={"Content-Type": "application/x-ndjson"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"PUT /v1/apps answered {response.status}: {answer}")
    return answer


def measure(work, apps, rounds):
    rows = []
    with bench.Started() as procs:
        origin, b1, b2 = bench.start_origin(work)
        procs.append(origin)
        for n in range(rounds):
            proc, http_port, admin_port = bench.start_switchyard(work, apps, b1, f"sync{n}")
            procs.append(proc)
            first = desired_file(work, apps, b1, b2, 0)
            synced_s, said = timed_cli(admin_port, str(first))
            again_s, again_said = timed_cli(admin_port, str(first))
            assert "nothing to change" in again_said, again_said
            baseline = []
            probe(http_port, admin_port, b1, b2, lambda: len(baseline) >= 50, baseline, 50, apps)
            during, sync_done, answer = [], threading.Event(), {}
            second = desired_file(work, apps, b1, b2, 1)

            def run_sync():
                started = time.perf_counter()
                try:
                    answer.update(api_sync(admin_port, second))
                    answer["seconds"] = time.perf_counter() - started
                finally:
                    sync_done.set()

            syncing = threading.Thread(target=run_sync)
            syncing.start()
            probe(http_port, admin_port, b1, b2, sync_done.is_set, during, 5050, apps)
            syncing.join()
            if "seconds" not in answer:
                raise RuntimeError("the sync during the probe failed")
            row = {"sync_s": round(synced_s, 2), "cli_said": said, "again_s": round(again_s, 2),
                   "api_sync_s": round(answer["seconds"], 2), "api_updates": len(answer["update"]),
                   "baseline": bench.summarize(baseline), "during": bench.summarize(during)}
            print(json.dumps(row), flush=True)
            rows.append(row)
            procs.remove(proc)
            proc.stop()
    return rows


def write_section(rows, apps):
    commit = subprocess.run(["git", "-C", str(bench.ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        TITLE, "",
        f"Measured on {when}, {bench.host()['machine']}; Switchyard at {commit} ({bench.BIN.parent.name} build). "
        f"{apps:,} apps in the embedded store (`bench-seed`), a desired set differing in 1% of them "
        "(backends changed; the probe's 1,000 apps are left out of it and kept, no prune). `apps sync` is the CLI end to end: the desired file read and sent, "
        "the plan, then the plan applied with its revision as If-Match (1,000 conditional writes "
        "in one transaction). Change-to-answer: a backend changed through the API until the proxy "
        "answers from it, on apps the sync does not touch, 50 samples before a sync and every "
        "sample during one (`PUT /v1/apps` moving 2%: the first 1% back, another 1% over).", "",
        "| round | `apps sync` (s) | again, nothing to change (s) | `PUT /v1/apps` (s) | change-to-answer before: p50 / p99 (ms) | during: p50 / p99 / max (ms), samples |",
        "|---|---|---|---|---|---|",
    ]
    for n, r in enumerate(rows, 1):
        b, d = r["baseline"], r["during"]
        lines.append(f"| {n} | {r['sync_s']} | {r['again_s']} | {r['api_sync_s']} | "
                     f"{b['p50_ms']:.1f} / {b['p99_ms']:.1f} | {d['p50_ms']:.1f} / {d['p99_ms']:.1f} / {d['max_ms']:.1f}, {d['n']} |")
    text = RESULTS.read_text()
    earlier = []
    if TITLE in text:
        start = text.index(TITLE)
        end = text.find("\n## ", start + len(TITLE))
        old = text[start:end if end != -1 else len(text)]
        stamp = next((l for l in old.splitlines() if l.startswith("Measured on ")), "")
        stamp = stamp[len("Measured on "):].split(",")[0] if stamp else "earlier"
        earlier = [f"- {stamp}: {l}" for l in old.splitlines() if l.startswith("| ") and l[2:3].isdigit()]
        earlier += [l for l in old.splitlines() if l.startswith("- ")]
        text = text[:start] + text[end + 1:] if end != -1 else text[:start]
    if earlier:
        lines += ["", "Earlier runs:", *earlier]
    RESULTS.write_text(text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.environ.get("SWITCHYARD_BIN"):
        bench.BIN = Path(os.environ["SWITCHYARD_BIN"])
    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-sync-"))
    rows = measure(work, args.apps, args.rounds)
    write_section(rows, args.apps)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
