#!/usr/bin/env python3
"""A flood of Host headers no app owns, each one new: does the proxy's memory grow?

Each proxy gets two rounds of wrk (1 thread, 32 keep-alive connections, ROUND_S seconds), each
request with a Host never seen before; the resident set (all its processes) is read before,
after round one and after round two. Switchyard caches "no such domain" answers (so a
repeated unknown name costs no store read) in its bounded domain cache (4 × --route-cache-apps
answers): run once with its default bound (100,000 apps: 400,000 answers) and once with
--route-cache-apps 1000 (4,000 answers), where round two must not grow it. nginx answers them
from a `default_server` returning 404 and keeps nothing. tests/floods.rs checks the same bound
for TLS server names. Everything listens on 127.0.0.1 and is stopped by PID. Results: the
"Unknown-host floods" section of bench/CONFORMANCE.md and bench/results/name_floods.json.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import (  # noqa: E402
    ROOT, Process, free_port, metric, nginx_conf, put_app, serve_switchyard, start_origin, wait_port)
from report import machine, replace_section, set_summary_row  # noqa: E402
from websockets import nginx_version, resident_kib  # noqa: E402

SECTION = "## Unknown-host floods (bench/conformance/name_floods.py)"
ROUND_S = 5

FLOOD_LUA = """
local counter = 0
local prefix = "x"
init = function(args) prefix = args[1] end
request = function()
  counter = counter + 1
  return wrk.format("GET", "/", {["Host"] = prefix .. "-" .. counter .. ".flood.test"})
end
"""


def flood(port, script, round_name):
    out = subprocess.run(["wrk", "-t1", "-c32", f"-d{ROUND_S}s", "-s", str(script),
                          f"http://127.0.0.1:{port}/", "--", round_name],
                         check=True, capture_output=True, text=True).stdout
    return int(next(l.split()[0] for l in out.splitlines() if " requests in " in l))


def measure(proxy, port, script, label):
    time.sleep(1)
    before = resident_kib(proxy.pid)
    first = flood(port, script, f"{label}-one")
    after_one = resident_kib(proxy.pid)
    second = flood(port, script, f"{label}-two")
    after_two = resident_kib(proxy.pid)
    row = {"hosts_round_one": first, "hosts_round_two": second, "rss_before_kib": before,
           "rss_after_one_kib": after_one, "rss_after_two_kib": after_two,
           "alive": proxy.proc.poll() is None}
    print(label, row, flush=True)
    return row


def switchyard(work, script, origin_port, name, *args):
    proxy, port, admin = serve_switchyard(work, name, "--threads", "2", "--waf", "off", *args)
    try:
        put_app(admin, "real", {"domains": ["real.test"], "backends": [f"127.0.0.1:{origin_port}"]})
        row = measure(proxy, port, script, name)
        row["domain_answers_kept"] = metric(admin, 'switchyard_route_cache_entries{table="domains"}')
        return row
    finally:
        proxy.stop()


def nginx(work, script):
    port = free_port()
    (work / "nginx-apps").mkdir(exist_ok=True)
    conf = work / "nginx.conf"
    conf.write_text(nginx_conf(work, port))
    proxy = Process("nginx", ["nginx", "-c", str(conf), "-p", str(work)], work)
    try:
        wait_port(port)
        return measure(proxy, port, script, "nginx")
    finally:
        proxy.stop()


def write_section(results):
    def mib(kib):
        return f"{kib / 1024:.1f}"

    def kept(r):
        return "–" if r.get("domain_answers_kept") is None else f"{r['domain_answers_kept']:,.0f}"
    lines = [SECTION, "",
             f"Measured on {results['date']}, {results['machine']}. Two rounds of {ROUND_S} s of wrk "
             "(1 thread, 32 keep-alive connections), every request with a Host never seen before; "
             "resident set of the proxy (all its processes) before and after each round.", "",
             "| proxy | new hosts, round 1 / 2 | RSS before MiB | after round 1 | after round 2 | "
             "growth in round 2 | \"no such domain\" answers kept |", "|---|---|---|---|---|---|---|"]
    for label, r in results["runs"].items():
        lines.append(f"| {label} | {r['hosts_round_one']:,} / {r['hosts_round_two']:,} | "
                     f"{mib(r['rss_before_kib'])} | {mib(r['rss_after_one_kib'])} | "
                     f"{mib(r['rss_after_two_kib'])} | "
                     f"{mib(r['rss_after_two_kib'] - r['rss_after_one_kib'])} MiB | "
                     f"{kept(r)} |")
    small = results["runs"]["Switchyard, --route-cache-apps 1000"]
    growth = small["rss_after_two_kib"] - small["rss_after_one_kib"]
    default = results["runs"]["Switchyard, default bound"]
    per_answer = ((default["rss_after_two_kib"] - default["rss_before_kib"]) * 1024
                  / max(default["domain_answers_kept"] or 1, 1))
    nginx_row = next(r for label, r in results["runs"].items() if label.startswith("nginx"))
    nginx_growth = nginx_row["rss_after_two_kib"] - nginx_row["rss_after_one_kib"]
    lines += ["", f"With its domain cache full (4,000 answers), round two changed Switchyard's resident "
              f"set by {growth / 1024:+.1f} MiB for {small['hosts_round_two']:,} new hosts (nginx: "
              f"{nginx_growth / 1024:+.1f} MiB). With the default bound, memory grows with the answers "
              f"kept, about {per_answer:.0f} B each here, until 400,000 are kept (about "
              f"{per_answer * 400_000 / 2**20:.0f} MiB); a platform expecting floods sets "
              "--route-cache-apps to what it needs."]
    set_summary_row("unknown-host flood, 2 × 5 s, a new Host each request (section below)",
                    [f"{growth / 1024:+.1f} MiB in round 2 with a full 4,000-answer cache",
                     f"{nginx_growth / 1024:+.1f} MiB in round 2"])
    replace_section(SECTION, lines)


def main():
    work = Path(tempfile.mkdtemp(prefix="switchyard-floods-"))
    try:
        script = work / "flood.lua"
        script.write_text(FLOOD_LUA)
        origin, origin_port, _ = start_origin(work)
        try:
            runs = {
                "Switchyard, default bound": switchyard(work, script, origin_port, "switchyard-default"),
                "Switchyard, --route-cache-apps 1000": switchyard(
                    work, script, origin_port, "switchyard-small", "--route-cache-apps", "1000"),
                f"nginx {nginx_version()}": nginx(work, script),
            }
        finally:
            origin.stop()
        results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
                   "round_s": ROUND_S, "runs": runs}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (ROOT / "bench" / "results" / "name_floods.json").write_text(json.dumps(results, indent=2) + "\n")
    write_section(results)
    return 0


def rewrite_report():
    write_section(json.loads((ROOT / "bench" / "results" / "name_floods.json").read_text()))


if __name__ == "__main__":
    if sys.argv[1:] == ["--report-only"]:
        rewrite_report()
        sys.exit(0)
    sys.exit(main())
