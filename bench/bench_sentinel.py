#!/usr/bin/env python3
"""Redis Sentinel failover under load: what a fleet loses when its store's primary dies.

Each round starts a fresh set on 127.0.0.1: a Redis primary, one replica and three
redis-sentinel processes (quorum 2, `down-after-milliseconds` 1000, the time a Sentinel
waits before calling the primary down, which bounds the failover from below), two routers
on `--store redis+sentinel://…` (`--redis-timeout-ms 300`), an nginx origin and 20 apps.
vegeta sends 500 req/s to each router over the 20 known hosts for the whole round; after
3 s the primary gets SIGKILL. An operator's tool then tries, every 50 ms through router A,
to move the app `probe` to another backend; router B is polled every 10 ms for that move.

Measured per round, from the kill: the first admin write that succeeds, the first answer
of router B from the new backend (the change crossed the new primary's Pub/Sub), the
admin writes refused meanwhile (503) and how long the slowest took, and the requests
that failed (target: 0 for the known hosts). Median over the rounds.

Results go to bench/results/latest.json under "sentinel" and to bench/RESULTS.md.
"""

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import bench as common
import report

MASTER = "main"
DOWN_AFTER_MS = 1000
HOSTS = 20
RATE = 500


def redis_cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                          text=True, timeout=10).stdout


def start_set(work, procs, tag):
    primary, replica = common.free_port(), common.free_port()
    servers = []
    for name, port, extra in (("primary", primary, []),
                              ("replica", replica, ["--replicaof", "127.0.0.1", str(primary)])):
        servers.append(common.Process(f"{tag}-{name}", [
            "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
            "--appendonly", "no", "--dir", str(work), *extra], work))
        procs.append(servers[-1])
        common.wait_port(port)
    sentinels = []
    for n in range(3):
        port = common.free_port()
        conf = work / f"{tag}-sentinel-{n}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {work}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER} 4000\nsentinel parallel-syncs {MASTER} 1\n")
        procs.append(common.Process(f"{tag}-sentinel-{n}", ["redis-sentinel", str(conf)], work))
        common.wait_port(port)
        sentinels.append(port)
    deadline = time.time() + 60
    while True:
        states = [redis_cli(port, "SENTINEL", "MASTER", MASTER).split("\n") for port in sentinels]
        met = all(dict(zip(s[::2], s[1::2])).get("num-other-sentinels") == "2"
                  and dict(zip(s[::2], s[1::2])).get("num-slaves") == "1" for s in states)
        if met:
            break
        if time.time() > deadline:
            raise RuntimeError(f"the Sentinels did not meet: {states}")
        time.sleep(0.2)
    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in sentinels) + f"/{MASTER}/0"
    return servers[0], primary, replica, url


def put(admin_port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{admin_port}{path}", method="PUT",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def vegeta(port, seconds, results, key):
    targets = "".join(f"GET http://127.0.0.1:{port}/\nHost: app{i}.test\n\n" for i in range(HOSTS))
    out = subprocess.run(
        [common.VEGETA, "attack", f"-rate={RATE}", f"-duration={seconds}s", "-timeout=5s",
         "-keepalive=true", "-connections=32", "-workers=32", "-max-workers=64"],
        input=targets.encode(), check=True, capture_output=True).stdout
    results[key] = json.loads(subprocess.run([common.VEGETA, "report", "-type=json"], input=out,
                                             check=True, capture_output=True).stdout)


def one_round(work, procs, tag, b1, b2, load_seconds):
    primary_proc, primary, replica, url = start_set(work, procs, tag)
    routers = []
    for name in ("a", "b"):
        proc, http, admin = common.serve_switchyard(
            work, f"{tag}-router-{name}", "--store", url, "--redis-timeout-ms", "300",
            "--threads", "1", "--waf", "off")
        procs.append(proc)
        routers.append((http, admin))
    (a_http, a_admin), (b_http, b_admin) = routers
    for i in range(HOSTS):
        common.put_app(a_admin, f"app{i}", {"domains": [f"app{i}.test"], "backends": [f"127.0.0.1:{b1}"]})
    common.put_app(a_admin, "probe", {"domains": ["probe.test"], "backends": [f"127.0.0.1:{b1}"]})
    for http in (a_http, b_http):
        common.wait_for_backend(http, "probe.test", b"b1", deadline_s=10)
        for i in range(HOSTS):
            common.get(http, f"app{i}.test")
    if "1" not in redis_cli(primary, "WAIT", "1", "5000"):
        raise RuntimeError("the replica did not take the seed")

    loads = {}
    threads = [threading.Thread(target=vegeta, args=(port, load_seconds, loads, name))
               for name, port in (("a", a_http), ("b", b_http))]
    for t in threads:
        t.start()
    time.sleep(3)
    killed = time.monotonic()
    primary_proc.proc.kill()
    primary_proc.proc.wait()

    refused, slowest, written = 0, 0.0, None
    while written is None and time.monotonic() - killed < 60:
        sent = time.monotonic()
        status = put(a_admin, "/v1/apps/probe/backends", {"backends": [f"127.0.0.1:{b2}"]})
        slowest = max(slowest, time.monotonic() - sent)
        if status == 200:
            written = time.monotonic() - killed
        elif status == 503:
            refused += 1
            time.sleep(0.05)
        else:
            raise RuntimeError(f"an admin write answered {status}")
    if written is None:
        raise RuntimeError("no write succeeded within 60 s of the kill")
    seen = None
    while seen is None and time.monotonic() - killed < 60:
        try:
            if common.get(b_http, "probe.test")[1] == b"b2\n":
                seen = time.monotonic() - killed
        except OSError:
            pass
        time.sleep(0.01)
    for t in threads:
        t.join()
    failed = sum(r["requests"] - r["status_codes"].get("200", 0) for r in loads.values())
    requests = sum(r["requests"] for r in loads.values())
    row = {"write_s": round(written, 3), "seen_on_other_router_s": round(seen, 3) if seen else None,
           "writes_refused": refused, "slowest_write_ms": round(slowest * 1000, 1),
           "requests": requests, "failed": failed,
           "errors": sorted({e for r in loads.values() for e in r.get("errors", [])})[:5]}
    print(f"round {tag}: {row}", flush=True)
    return row


def measure(work, seconds, procs, quick):
    origin, b1, b2 = common.start_origin(work)
    procs.append(origin)
    rows = []
    for n in range(1 if quick else 5):
        # Each round has its own set and routers; they are stopped before the next starts.
        with common.Started() as round_procs:
            rows.append(one_round(work, round_procs, f"r{n}", b1, b2, max(seconds, 10)))
    median = lambda key: sorted(r[key] for r in rows)[len(rows) // 2]
    return {"rounds": rows, "down_after_ms": DOWN_AFTER_MS, "rate_per_router": RATE,
            "median_write_s": median("write_s"), "median_seen_s": median("seen_on_other_router_s"),
            "failed_requests": sum(r["failed"] for r in rows),
            "requests": sum(r["requests"] for r in rows)}


def main():
    quick = "--quick" in sys.argv
    return report.run_section("sentinel", __doc__,
                              lambda work, seconds, procs: measure(work, seconds, procs, quick))


if __name__ == "__main__":
    sys.exit(main())
