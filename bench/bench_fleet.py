#!/usr/bin/env python3
"""Fleet mode: two Switchyard routers sharing one Redis on loopback, beside the embedded store.

Measurements, added to bench/results/latest.json under "fleet" and to bench/RESULTS.md:
- change propagation: time from the start of a PUT of an app's backends on router A until
  router B answers a new connection from the new backend, 200 changes, at 1,000, 10,000
  and 100,000 stored apps;
- warm-cache throughput (wrk, one hot host) with the Redis store and with the embedded store;
- cold-cache throughput: wrk walking 100,000 distinct hosts on a freshly started router, so
  every request is a route-cache miss that reads the store.

The peer is an nginx+Lua router built the way seed 000 describes (bench/nginx-lua/): it reads
the same Redis layout, caches routes in a per-worker LRU and drops entries on the same Pub/Sub
events; it is measured for propagation (PUT on Switchyard A, answer on nginx+Lua) and
throughput beside Switchyard.

Apps are written to Redis with `redis-cli --pipe` following docs/fleet.md's "Redis layout",
the way a platform's own tooling would.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import bench as common
import report


class Redis:
    def __init__(self, work):
        self.port = common.free_port()
        self.proc = common.Process("redis", [
            "redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
            "--appendonly", "no", "--dir", str(work)], work)
        common.wait_port(self.port)

    def cli(self, *args, stdin=None):
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], input=stdin,
                              check=True, capture_output=True).stdout

    def flush_and_seed(self, apps, backend):
        self.cli("FLUSHALL")
        out = []
        for i in range(apps):
            name, domain = f"app{i}", f"app{i}.bench"
            record = json.dumps({"name": name, "domains": [domain],
                                 "backends": [{"address": f"127.0.0.1:{backend}", "weight": 1}]})
            for command in (("SET", f"switchyard:app:{name}", record),
                            ("SET", f"switchyard:domain:{domain}", name),
                            ("ZADD", "switchyard:apps", "0", name)):
                out.append(f"*{len(command)}\r\n")
                for arg in command:
                    out.append(f"${len(arg.encode())}\r\n{arg}\r\n")
        self.cli("--pipe", stdin="".join(out).encode())

    def stop(self):
        self.proc.stop()


def start_router(work, tag, store_args, data_dir=None):
    http_port, admin_port = common.free_port(), common.free_port()
    data_dir = data_dir or work / f"data-{tag}"
    proc = common.Process(f"switchyard-{tag}", [
        str(common.BIN), "serve", "--http", f"127.0.0.1:{http_port}", "--https", "off",
        "--admin", f"127.0.0.1:{admin_port}", "--data-dir", str(data_dir),
        "--threads", str(common.THREADS), "--access-log", "off", "--shutdown-grace-s", "0",
        *store_args], work, env={"RUST_LOG": "warn", "PATH": "/usr/bin:/bin"})
    common.wait_port(http_port)
    common.wait_port(admin_port)
    return proc, http_port, admin_port


LUA_DIR = common.ROOT / "bench" / "nginx-lua"


def start_nginx_lua(work, tag, redis_port):
    port = common.free_port()
    conf = work / f"nginx-lua-{tag}.conf"
    conf.write_text(f"""
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
worker_processes {common.THREADS};
daemon off;
pid {work}/nginx-lua-{tag}.pid;
error_log {work}/nginx-lua-{tag}-error.log;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    lua_package_path "{LUA_DIR}/?.lua;/usr/share/lua/5.1/?.lua;;";
    init_by_lua_block {{ require("switchyard_lua_router").init("127.0.0.1", {redis_port}, 200000) }}
    init_worker_by_lua_block {{ require("switchyard_lua_router").start_subscriber() }}
    upstream dynamic {{
        server 0.0.0.1;
        balancer_by_lua_block {{ require("switchyard_lua_router").balance() }}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            access_by_lua_block {{ require("switchyard_lua_router").route() }}
            proxy_pass http://dynamic;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
        }}
    }}
}}
""")
    proc = common.Process(f"nginx-lua-{tag}", ["nginx", "-c", str(conf), "-p", str(work)], work)
    common.wait_port(port)
    return proc, port


def cold_throughput(port, apps, seconds, work):
    script = work / "walk.lua"
    script.write_text(
        "counter = 0\n"
        "request = function()\n"
        "  counter = counter + 1\n"
        f"  return wrk.format('GET', '/', {{Host = 'app' .. (counter % {apps}) .. '.bench'}})\n"
        "end\n")
    out = subprocess.run(["wrk", "-t1", "-c32", f"-d{seconds}s", "-s", str(script),
                          f"http://127.0.0.1:{port}/"], check=True, capture_output=True, text=True).stdout
    return float(next(l for l in out.splitlines() if l.startswith("Requests/sec:")).split()[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seconds = 3 if args.quick else args.seconds
    sizes = [1000] if args.quick else [1000, 10000, 100000]
    changes = 20 if args.quick else 200
    cold_apps = 10000 if args.quick else 100000

    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-fleet-"))
    results = {"propagation": [], "throughput": {}, "cold": {}}
    with common.Started() as procs:
        origin, b1, b2 = common.start_origin(work)
        procs.append(origin)
        redis = Redis(work)
        procs.append(redis)
        redis_store = ["--store", f"redis://127.0.0.1:{redis.port}/0"]

        for apps in sizes:
            redis.flush_and_seed(apps, b1)
            a, _, a_admin = start_router(work, f"a-{apps}", redis_store)
            b, b_http, _ = start_router(work, f"b-{apps}", redis_store)
            procs += [a, b]
            r = common.switchyard_route_changes(b_http, a_admin, apps, b1, b2, changes)
            results["propagation"].append({"apps": apps, "router": "switchyard", **r})
            print(f"propagation A→B at {apps} apps: p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms", flush=True)
            ng, ng_port = start_nginx_lua(work, f"prop-{apps}", redis.port)
            procs.append(ng)
            r = common.switchyard_route_changes(ng_port, a_admin, apps, b1, b2, changes)
            results["propagation"].append({"apps": apps, "router": "nginx+lua", **r})
            print(f"propagation A→nginx+Lua at {apps} apps: p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms",
                  flush=True)
            for p in (a, b, ng):
                p.stop()
                procs.remove(p)

        def each_peer(phase, apps):
            """Seeds `apps` apps in Redis and in an embedded store, then yields the name and
            port of each peer serving them (the router on either store, nginx+lua), one at a
            time, each stopped after its turn."""
            redis.flush_and_seed(apps, b1)
            embedded_data = work / f"data-{phase}-embedded"
            subprocess.run([str(common.BIN), "bench-seed", "--data-dir", str(embedded_data), "--apps",
                            str(apps), "--backend", f"127.0.0.1:{b1}"], check=True, stdout=subprocess.DEVNULL)
            peers = (
                ("redis", lambda: start_router(work, f"{phase}-redis", redis_store, None)[:2]),
                ("embedded", lambda: start_router(work, f"{phase}-embedded", [], embedded_data)[:2]),
                ("nginx+lua", lambda: start_nginx_lua(work, phase, redis.port)),
            )
            for name, start in peers:
                proc, port = start()
                procs.append(proc)
                yield name, port
                proc.stop()
                procs.remove(proc)

        # Warm cache: the same 1,000 apps everywhere, one hot host.
        for name, port in each_peer("warm", 1000):
            common.wrk_throughput(port, 2)
            rps, errors = common.wrk_throughput(port, seconds)
            results["throughput"][name] = {"rps": rps, "errors": errors}
            print(f"warm throughput {name}: {rps:.0f} req/s {errors}", flush=True)

        # Cold cache: every request of the walk is a first visit.
        for name, port in each_peer("cold", cold_apps):
            rps = cold_throughput(port, cold_apps, seconds, work)
            results["cold"][name] = {"rps": rps, "apps": cold_apps}
            print(f"cold-cache throughput {name}: {rps:.0f} req/s", flush=True)

    return report.finish_section("fleet", results, args.quick, work)


if __name__ == "__main__":
    sys.exit(main())
