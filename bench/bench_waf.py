#!/usr/bin/env python3
"""WAF and worker pool: Switchyard beside nginx + ModSecurity, and seed 001's question.

Both proxies inspect with libmodsecurity 3.0.9 and the same OWASP Core Rule Set (Debian's
modsecurity-crs, paranoia 1, request bodies inspected) in front of the same fast origin (an
nginx answering 200 at once):
- Switchyard: the app's `waf` in block mode, inspections on its worker pool;
- nginx 1.22 with libnginx-mod-http-modsecurity, the same directives.

Part 1, WAF throughput: benign form POSTs with 10 KB and 50 KB bodies, closed loop
(`wrk -t2 -c64`), counted in 2xx answers per second (a busy pool's 503 is not an inspected
request); each run starts on a quiet machine, not beside the other proxy's backlog; three
alternated runs of each proxy per size, the median reported with the runs beside it.
CPU per inspected request at a constant rate (utime + stime of each proxy's processes ÷
requests; vegeta at a rate well under either proxy's capacity, three alternated runs each):
on two shared cores the steadier figure beside closed-loop throughput.
Part 2, light beside heavy (seed 001): a light GET route (an app without the WAF) at a
constant 500 req/s (vegeta, 1 s timeout), alone and while wrk keeps 100, 200 and 400
connections of 50 KB inspected POSTs going; light p50/p99 and timeouts, heavy p50/p99 and
errors. Twice: inspections on the worker pool, and forced inline on the event loops
(`SWITCHYARD_BENCH_POOL=inline`, what a router without a pool does). Beside them, the machine's floor:
the light route beside two `SCHED_IDLE` processes burning CPU and no heavy request.
Results go to bench/results/latest.json under "waf" and to bench/RESULTS.md.
"""

import statistics
import subprocess
import sys
from pathlib import Path

import bench as common
import report


WAF_HOST = "shop.bench"
LIGHT_HOST = "light.bench"
BODY_SIZES = [10_000, 50_000]
LIGHT_RATE = 500
HEAVY_CONNECTIONS = [100, 200, 400]
# Alternated throughput runs of each proxy per body size; the median is reported.
THROUGHPUT_ROUNDS = 3
# Constant rates for CPU per inspected request, by body size: about 40% of what either proxy
# inspects per second on this machine (about 240 and 55).
CPU_RATES = {10_000: 100, 50_000: 25}
CPU_ROUNDS = 3
MODSEC_MODULE = "/usr/lib/nginx/modules/ngx_http_modsecurity_module.so"

# The directives Switchyard loads (crates/waf/src/lib.rs, rule_text) at paranoia 1.
MODSEC_RULES = r"""
SecRuleEngine On
SecRequestBodyAccess On
SecRequestBodyLimit 67108864
SecRequestBodyNoFilesLimit 67108864
SecRequestBodyLimitAction ProcessPartial
SecResponseBodyAccess Off
SecAuditEngine Off
SecArgumentSeparator &
SecCookieFormat 0
SecRule REQUEST_HEADERS:Content-Type "^(?:application(?:/soap\+|/)|text/)xml" "id:200000,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=XML"
SecRule REQUEST_HEADERS:Content-Type "^application/json" "id:200001,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=JSON"
SecRule REQBODY_ERROR "!@eq 0" "id:200002,phase:2,t:none,log,deny,status:400,msg:'Failed to parse request body.',severity:2"
SecAction "id:900000,phase:1,nolog,pass,t:none,setvar:tx.paranoia_level=1"
Include /etc/modsecurity/crs/crs-setup.conf
Include /usr/share/modsecurity-crs/rules/*.conf
"""


def start_origin(work):
    port = common.free_port()
    proc = common.start_nginx_origin(work, "origin", f"""
    client_max_body_size 1m;
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 200 "ok\\n"; }}
    }}""", [port])
    return proc, port


def start_nginx_modsecurity(work, origin_port):
    port = common.free_port()
    (work / "modsec.conf").write_text(MODSEC_RULES)
    conf = work / "nginx-waf.conf"
    conf.write_text(f"""
load_module {MODSEC_MODULE};
user root;
worker_processes {common.THREADS};
daemon off;
pid {work}/nginx-waf.pid;
error_log {work}/nginx-waf-error.log;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_max_body_size 1m;
    client_body_buffer_size 128k;
    upstream origin {{ server 127.0.0.1:{origin_port}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            modsecurity on;
            modsecurity_rules_file {work}/modsec.conf;
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
        }}
    }}
}}
""")
    proc = common.Process("nginx-waf", ["nginx", "-c", str(conf), "-p", str(work)], work)
    common.wait_port(port, timeout=120)
    return proc, port


def start_switchyard(work, origin_port, pool_mode="threads", pool_sched=None):
    proc, http_port, admin_port = common.serve_switchyard(
        # Short names: the data directory holds the handover socket, whose path is bounded.
        work, f"switchyard-waf-{pool_mode}{(pool_sched or '').replace('idle-kernel', 'ik')}", "--threads", str(common.THREADS),
        "--pool-threads", str(common.THREADS), log_level="error", env=common.benchmark_pool(pool_mode, pool_sched))
    # Every request inspected (or refused with 503, counted by wrk): no uninspected pass.
    waf = {"mode": "block", "timeout_ms": 5000, "on_overload": "closed"}
    for name, host, extra in [("shop", WAF_HOST, {"waf": waf}), ("light", LIGHT_HOST, {})]:
        common.put_app(admin_port, name, {"domains": [host], "backends": [f"127.0.0.1:{origin_port}"], **extra})
    proc.admin_port = admin_port
    return proc, http_port


def form_body(size):
    """A benign form of `size` bytes (words, as a comment would be)."""
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit "
    return "name=Ada&comment=" + (words * (size // len(words) + 1)).replace(" ", "+")[:size - 17]


def post_script(work, size):
    """A wrk script posting a benign form of `size` bytes."""
    body = form_body(size)
    script = work / f"post-{size}.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f'wrk.body = "{body}"\n'
        'wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"\n'
        f'wrk.headers["Host"] = "{WAF_HOST}"\n')
    return script


def wrk_post(port, script, seconds, connections):
    """(2xx answers per second, every answer per second, wrk's error lines): a busy pool's
    503 is an answer to wrk, not an inspected request."""
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-s", str(script), "--timeout", "5s",
         f"http://127.0.0.1:{port}/comments"],
        check=True, capture_output=True, text=True).stdout
    rps, errors = common.parse_wrk(out)
    return common.answered_2xx_per_s(out), rps, errors


def cpu_per_inspection(work, proxies, seconds):
    """For each body size, each proxy's CPU (utime + stime of its processes) per inspected
    POST at the size's constant rate: `proxies` is [(name, http port, process)]. Alternated
    runs, each on a quiet machine; the median and every run."""
    rows = []
    for size, rate in CPU_RATES.items():
        body = work / f"form-{size}"
        body.write_text(form_body(size))
        runs = common.cpu_per_request(
            proxies, lambda port: (f"POST http://127.0.0.1:{port}/comments\nHost: {WAF_HOST}\n"
                                   f"Content-Type: application/x-www-form-urlencoded\n@{body}\n"),
            rate, seconds, CPU_ROUNDS, f"{size:6} B")
        row = {"body_bytes": size, "rate": rate}
        for name, measured in runs.items():
            row[name] = {"cpu_ms": statistics.median(r["cpu_ms"] for r in measured),
                         "cpu_ms_runs": [round(r["cpu_ms"], 2) for r in measured],
                         "success": min(r["success"] for r in measured)}
        rows.append(row)
    return rows


def check_blocks(port):
    """Both proxies must really inspect: an SQL injection probe gets 403."""
    status, _ = common.get(port, WAF_HOST, "/products?id=1%27%20OR%20%271%27=%271")
    if status != 403:
        raise SystemExit(f"the WAF on port {port} answered {status} to an SQL injection probe")


def light_latency(port, seconds):
    target = f"GET http://127.0.0.1:{port}/\nHost: {LIGHT_HOST}\n"
    out = subprocess.run([common.VEGETA, "attack", f"-rate={LIGHT_RATE}", f"-duration={seconds}s",
                          "-timeout=1s"], input=target.encode(), check=True,
                         capture_output=True).stdout
    return common.vegeta_summary(out)


# A process that burns CPU at the lowest priority, as a worker pool's thread does.
IDLE_SPINNER = ("import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
                "while True:\n    pass\n")
FLOOR_ROUNDS = 3


def idle_neighbour_floor(port, seconds):
    """The machine's own floor under seed 001's ratio: the light route alone, then beside as
    many `SCHED_IDLE` processes burning CPU as the pool has workers, and no heavy request at
    all: what a lowest-priority neighbour costs the light route on this machine before the
    router does any heavy work. Alternated FLOOR_ROUNDS times; the ratio of the medians."""
    rounds = []
    for _ in range(FLOOR_ROUNDS):
        common.wait_for_quiet()
        alone = light_latency(port, seconds)
        spinners = [subprocess.Popen([sys.executable, "-c", IDLE_SPINNER]) for _ in range(common.THREADS)]
        try:
            beside = light_latency(port, seconds)
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
        rounds.append({"alone_p99_ms": alone["p99_ms"], "beside_p99_ms": beside["p99_ms"],
                       "beside_success": beside["success"]})
        print(f"idle neighbours: light p99 alone {alone['p99_ms']:.2f} ms, beside {common.THREADS} "
              f"SCHED_IDLE spinners {beside['p99_ms']:.2f} ms", flush=True)
    ratio = (statistics.median(r["beside_p99_ms"] for r in rounds)
             / statistics.median(r["alone_p99_ms"] for r in rounds))
    return {"spinners": common.THREADS, "rounds": rounds, "ratio": round(ratio, 2)}


def light_beside_heavy(port, script, url_path, seconds, connections):
    """Light latency while `connections` wrk clients run `script` against `url_path`; the
    heavy requests' rate, errors and latency (p50/p99) and wrk's output."""
    heavy = subprocess.Popen(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds + 2}s", "-s", str(script), "--timeout", "5s",
         "--latency", f"http://127.0.0.1:{port}{url_path}"], stdout=subprocess.PIPE, text=True)
    try:
        light = light_latency(port, seconds)
    finally:
        out, _ = heavy.communicate(timeout=seconds + 30)
    rps, errors = common.parse_wrk(out)
    p50, p99 = common.wrk_latency_ms(out)
    return {"connections": connections, "heavy_rps": rps, "heavy_errors": errors,
            "heavy_p50_ms": p50, "heavy_p99_ms": p99, **light}, out


def honouring_retry_after(script):
    """`script` for clients that honour Retry-After: each 503 holds one of the thread's next
    requests back for its Retry-After (jittered ±50%, as careful clients spread retries).
    wrk's delay() has no connection of its own, so delays are owed per thread rather than
    per connection; the count of held-back requests equals the count of refusals."""
    polite = script.with_name(script.stem + "-retry-after.lua")
    polite.write_text(script.read_text() + """
local owed = {}
function response(status, headers, body)
  if status == 503 then
    local after = tonumber(headers["Retry-After"] or headers["retry-after"]) or 1
    owed[#owed + 1] = after * 1000 * (0.5 + math.random())
  end
end
function delay()
  if #owed == 0 then return 0 end
  return table.remove(owed, 1)
end
""")
    return polite


def pool_outcomes(admin_port):
    """What the router's pool did with WAF inspections so far: inspected (passed), refused
    before queueing, shed from the queue before the deadline, timed out at the deadline."""
    text = common.get(admin_port, "admin", "/metrics")[1].decode()

    def total(prefix, *having):
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith(prefix) and all(h in line for h in having))
    return {"inspected": total("switchyard_waf_requests_total{", 'result="pass"'),
            "refused": total("switchyard_pool_rejected_total{", 'stage="waf"'),
            "shed": total("switchyard_pool_shed_total{", 'stage="waf"'),
            "timed_out": total("switchyard_pool_timeouts_total{", 'stage="waf"')}


def isolation(port, script, url_path, seconds, label, more=lambda row, out: {}, admin_port=None):
    """Seed 001's rows for one router: the light route alone, then beside each count of
    heavy connections; `more(row, wrk output)` adds figures of the caller's own to a row, and
    with `admin_port` each row counts what the pool did with the heavy requests.
    Each row starts on a quiet machine, not beside the last row's backlog."""
    common.wait_for_quiet()
    alone = light_latency(port, seconds)
    rows = [{"connections": 0, "heavy_rps": 0, "heavy_errors": [], "heavy_p50_ms": None,
             "heavy_p99_ms": None, **alone}]
    print(f"{label}: light alone p50 {alone['p50_ms']:.2f} ms p99 {alone['p99_ms']:.2f} ms "
          f"success {alone['success']:.4f}", flush=True)
    for connections in HEAVY_CONNECTIONS:
        common.wait_for_quiet()
        before = admin_port and pool_outcomes(admin_port)
        row, out = light_beside_heavy(port, script, url_path, seconds, connections)
        row.update(more(row, out))
        if admin_port:
            after = pool_outcomes(admin_port)
            row["pool"] = {name: after[name] - before[name] for name in after}
        rows.append(row)
        print(f"{label}: heavy x{connections}: light p50 {row['p50_ms']:.2f} ms p99 {row['p99_ms']:.2f} ms "
              f"success {row['success']:.4f}; heavy {row['heavy_rps']:.0f} req/s p99 "
              f"{row['heavy_p99_ms']} ms {row['heavy_errors']} {row.get('pool', '')}", flush=True)
    return rows


FIRST_BURST_CONNECTIONS = 400


def first_burst(work, origin_port, seconds, procs):
    """A router started a moment ago, whose pool has timed no inspection yet, met at once by
    400 wrk connections of 50 KB inspected POSTs: how its answers split between inspected,
    refused early (503 + Retry-After before queueing), shed from the queue before the
    deadline, and refused at the deadline (queued, then timed out: what the issue's "never a
    timeout" rules out)."""
    common.wait_for_quiet()
    sy, port = start_switchyard(work, origin_port)
    procs.append(sy)
    script = post_script(work, 50_000)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{FIRST_BURST_CONNECTIONS}", f"-d{seconds}s", "-s", str(script), "--timeout", "6s",
         f"http://127.0.0.1:{port}/comments"], check=True, capture_output=True, text=True).stdout
    counted = pool_outcomes(sy.admin_port)
    sy.stop()
    row = {"connections": FIRST_BURST_CONNECTIONS, **counted, "wrk_errors": common.parse_wrk(out)[1]}
    print(f"first burst: {row}", flush=True)
    return row


def measure(work, seconds, procs):
    if not Path(MODSEC_MODULE).exists():
        raise SystemExit("nginx's ModSecurity module is missing: apt install libnginx-mod-http-modsecurity")
    earlier = common.earlier_summary("waf", lambda s: {
        "throughput_ratios": [round(report.ok_rps(r["switchyard"]) / report.ok_rps(r["nginx"]), 2) for r in s["throughput"]],
        "light_p99_ratios": [round(r["p99_ms"] / s["isolation"][0]["p99_ms"], 2) for r in s["isolation"][1:]]})
    results = {"seconds": seconds, "light_rate": LIGHT_RATE, "throughput": [], "isolation": [],
               "earlier_runs": earlier}
    origin, origin_port = start_origin(work)
    procs.append(origin)
    results["first_burst"] = first_burst(work, origin_port, seconds, procs)
    sy, sy_port = start_switchyard(work, origin_port)
    procs.append(sy)
    ng, ng_port = start_nginx_modsecurity(work, origin_port)
    procs.append(ng)
    for port in (sy_port, ng_port):
        check_blocks(port)

    for size in BODY_SIZES:
        script = post_script(work, size)
        runs = {"switchyard": [], "nginx": []}
        for round_ in range(THROUGHPUT_ROUNDS):
            # Alternated, the one that went second going first next time: on shared cores a
            # single run of each swings by a fifth (nginx made 194–259 req/s at 10 KB in one
            # afternoon), and the median of alternations is what one proxy can be said to do.
            order = [("switchyard", sy_port), ("nginx", ng_port)]
            for name, port in order[::-1] if round_ % 2 else order:
                common.wait_for_quiet()
                ok_rps, rps, errors = wrk_post(port, script, seconds, 64)
                runs[name].append({"ok_rps": ok_rps, "rps": rps, "errors": errors})
                print(f"{size:6} B {name:10} {ok_rps:9.0f} req/s 2xx ({rps:.0f} answered) {errors}", flush=True)
        row = {"body_bytes": size}
        for name, measured in runs.items():
            row[name] = {"ok_rps": statistics.median(r["ok_rps"] for r in measured),
                         "rps": statistics.median(r["rps"] for r in measured),
                         "errors": [e for r in measured for e in r["errors"]],
                         "ok_rps_runs": [r["ok_rps"] for r in measured]}
        results["throughput"].append(row)

    results["cpu_per_request"] = cpu_per_inspection(
        work, [("switchyard", sy_port, sy), ("nginx", ng_port, ng)], seconds)

    # nginx has done its part: only one proxy under load from here on.
    ng.stop()
    results["idle_neighbour"] = idle_neighbour_floor(sy_port, seconds)
    script = post_script(work, 50_000)
    # The light route through Switchyard: alone, then beside heavy inspected POSTs; on the
    # pool, then with the same router forced to inspect inline.
    results["isolation"] = isolation(sy_port, script, "/comments", seconds, "pool",
                                     admin_port=sy.admin_port)
    # wrk asks again the moment it is refused, so beside 200 and 400 connections the router
    # mostly answers refusals; clients that honour Retry-After show the heavy work alone.
    results["isolation_retry_after"] = isolation(sy_port, honouring_retry_after(script), "/comments",
                                                 seconds, "pool, clients honour Retry-After",
                                                 admin_port=sy.admin_port)
    sy.stop()
    # The same pool with the workers scheduled the other ways, to choose by measurement.
    for sched, key in (("idle-kernel", "isolation_idle_kernel"), ("nice", "isolation_nice"),
                       ("pinned", "isolation_pinned")):
        other, other_port = start_switchyard(work, origin_port, pool_sched=sched)
        procs.append(other)
        check_blocks(other_port)
        results[key] = isolation(other_port, script, "/comments", seconds, f"pool, {sched}")
        other.stop()
    inline, inline_port = start_switchyard(work, origin_port, "inline")
    procs.append(inline)
    check_blocks(inline_port)
    results["isolation_inline"] = isolation(inline_port, script, "/comments", seconds, "inline")
    return results


if __name__ == "__main__":
    sys.exit(report.run_section("waf", __doc__, measure))
