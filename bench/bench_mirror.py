#!/usr/bin/env python3
"""Traffic mirroring: seed 003's experiment, Switchyard beside nginx's `mirror` module.

A constant 1,000 req/s goes through each proxy to the same primary backend, with
(a) no mirror, (b) a healthy mirror, (c) a mirror answering 500 to everything, and
(d) a mirror that waits 1 s before answering. Each is run two ways:
- "one connection": a single keep-alive connection that sends the next request as soon as
  the previous answer arrives, at most 1,000 req/s, 1 s client timeout — the article's
  `hey -c 1 -q 1000 -t 1`, where nginx fell to ~2 req/s with the slow mirror;
- "open loop": vegeta at a fixed 1,000 req/s over as many connections as it needs.

Reported per run: achieved rate, mean, p50 and p99, success; for Switchyard also the copies
delivered and dropped (from its metrics). Switchyard's mirror is set to mirror everything
with room for every copy (`max_in_flight` 2,000, `timeout_ms` 5,000), so nothing is shed to
keep the primary fast. Results go to bench/results/latest.json under "mirror" and to
bench/RESULTS.md.

The primary and the healthy and erroring mirrors are one nginx; the 1 s mirror is nginx with
the Lua module (`ngx.sleep`), which holds thousands of waiting requests cheaply.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import bench as common
import report

RATE = 1000
SCENARIOS = ["none", "healthy", "erroring", "slow"]


def start_backends(work):
    ports = {name: common.free_port() for name in ("primary", "healthy", "erroring", "slow")}
    proc = common.start_nginx_origin(work, "mirror-backends", f"""
    server {{ listen 127.0.0.1:{ports['primary']}; location / {{ return 200 "primary\\n"; }} }}
    server {{ listen 127.0.0.1:{ports['healthy']}; location / {{ return 200 "shadow\\n"; }} }}
    server {{ listen 127.0.0.1:{ports['erroring']}; location / {{ return 500 "broken\\n"; }} }}
    server {{
        listen 127.0.0.1:{ports['slow']};
        location / {{ content_by_lua_block {{ ngx.sleep(1) ngx.say("late") }} }}
    }}""", ports.values(), worker_connections=16384,
                                     main="load_module /usr/lib/nginx/modules/ndk_http_module.so;\n"
                                          "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;")
    return proc, ports


def start_nginx_mirror(work, scenario, ports):
    port = common.free_port()
    mirror = "" if scenario == "none" else "mirror /mirror;\n            mirror_request_body on;"
    mirror_port = ports.get(scenario, ports["healthy"])
    conf = work / f"nginx-mirror-{scenario}.conf"
    conf.write_text(f"""
worker_processes {common.THREADS};
daemon off;
pid {work}/nginx-mirror-{scenario}.pid;
error_log {work}/nginx-mirror-{scenario}-error.log;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    upstream primary {{ server 127.0.0.1:{ports['primary']}; keepalive 64; }}
    upstream shadow {{ server 127.0.0.1:{mirror_port}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            {mirror}
            proxy_pass http://primary;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
        }}
        location = /mirror {{
            internal;
            proxy_pass http://shadow$request_uri;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Mirrored-By nginx;
        }}
    }}
}}
""")
    proc = common.Process(f"nginx-mirror-{scenario}", ["nginx", "-c", str(conf), "-p", str(work)], work)
    common.wait_port(port)
    return proc, port


def start_switchyard(work):
    http_port, admin_port = common.free_port(), common.free_port()
    proc = common.Process("switchyard-mirror", [
        str(common.BIN), "serve", "--http", f"127.0.0.1:{http_port}", "--https", "off",
        "--admin", f"127.0.0.1:{admin_port}", "--data-dir", str(work / "switchyard-mirror-data"),
        "--threads", str(common.THREADS), "--access-log", "off", "--shutdown-grace-s", "0",
    ], work, env={"RUST_LOG": "warn", "PATH": "/usr/bin:/bin"})
    common.wait_port(http_port)
    common.wait_port(admin_port)
    return proc, http_port, admin_port


def configure_switchyard(admin_port, scenario, ports):
    spec = {"domains": [common.HOT_HOST], "backends": [f"127.0.0.1:{ports['primary']}"]}
    if scenario != "none":
        spec["mirror"] = {"backends": [f"127.0.0.1:{ports[scenario]}"], "percent": 100,
                          "max_in_flight": 2000, "timeout_ms": 5000}
    request = urllib.request.Request(f"http://127.0.0.1:{admin_port}/v1/apps/bench", method="PUT",
                                     data=json.dumps(spec).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def attack(port, seconds, one_connection):
    target = f"GET http://127.0.0.1:{port}/?apikey=1\nHost: {common.HOT_HOST}\n"
    if one_connection:
        # hey -c 1 -q 1000 -t 1: one worker on one connection, at most RATE req/s.
        flags = ["-workers=1", "-max-workers=1", "-connections=1", "-max-connections=1", "-timeout=1s"]
    else:
        flags = ["-timeout=5s"]
    out = subprocess.run(
        [common.VEGETA, "attack", f"-rate={RATE}", f"-duration={seconds}s", "-keepalive=true", *flags],
        input=target.encode(), check=True, capture_output=True).stdout
    return common.vegeta_summary(out)


def mirror_counts(admin_port):
    _, text = common.get(admin_port, "admin", "/metrics")
    sent = dropped = 0.0
    for line in text.decode().splitlines():
        if line.startswith("switchyard_mirror_sent_total{"):
            sent += float(line.split()[-1])
        elif line.startswith("switchyard_mirror_dropped_total{"):
            dropped += float(line.split()[-1])
    return sent, dropped


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seconds = 3 if args.quick else args.seconds
    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-mirror-"))
    results = {"rate": RATE, "seconds": seconds, "runs": []}
    with common.Started() as procs:
        backends, ports = start_backends(work)
        procs.append(backends)
        sy, sy_port, sy_admin = start_switchyard(work)
        procs.append(sy)
        for scenario in SCENARIOS:
            configure_switchyard(sy_admin, scenario, ports)
            for one_connection in (True, False):
                mode = "one connection" if one_connection else "open loop"
                before = mirror_counts(sy_admin)
                r = attack(sy_port, seconds, one_connection)
                # Copies to the 1 s mirror are still in flight when the load stops.
                time.sleep(2.5 if scenario == "slow" else 0.5)
                after = mirror_counts(sy_admin)
                r.update(proxy="switchyard", scenario=scenario, mode=mode,
                         mirrored=after[0] - before[0], dropped=after[1] - before[1])
                results["runs"].append(r)
                print(f"switchyard {scenario:9} {mode:14} {r['achieved_rps']:7.1f} req/s "
                      f"mean {r['mean_ms']:.3f} p99 {r['p99_ms']:.3f} ms success {r['success']:.3f} "
                      f"mirrored {r['mirrored']:.0f} dropped {r['dropped']:.0f}", flush=True)
            for one_connection in (True, False):
                ng, ng_port = start_nginx_mirror(work, scenario, ports)
                mode = "one connection" if one_connection else "open loop"
                r = attack(ng_port, seconds, one_connection)
                r.update(proxy="nginx", scenario=scenario, mode=mode)
                results["runs"].append(r)
                print(f"nginx      {scenario:9} {mode:14} {r['achieved_rps']:7.1f} req/s "
                      f"mean {r['mean_ms']:.3f} p99 {r['p99_ms']:.3f} ms success {r['success']:.3f}",
                      flush=True)
                ng.stop()
    return report.finish_section("mirror", results, args.quick, work)


if __name__ == "__main__":
    sys.exit(main())
