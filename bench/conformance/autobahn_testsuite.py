#!/usr/bin/env python3
"""WebSocket conformance through the proxies: Autobahn|Testsuite's fuzzing client, every
case, through Switchyard and through nginx in one run, to the same conformant echo backend
(Autobahn's own echo server, bench/conformance/autobahn_echo.py, with permessage-deflate).

A proxy passes a case when the client sees what it would have seen talking to the echo
server directly: every frame, fragment, close code and compressed message crosses the proxy
unchanged and in order. Target (issue 9): no case FAILED; OK, NON-STRICT and INFORMATIONAL
(cases that only record a choice) are passes.

Needs Autobahn|Testsuite 0.8.2 in a Python 2.7 environment: AUTOBAHN_VENV names it
(bench/conformance/run makes it from autobahn-requirements.txt). Results: the "WebSocket
conformance" section of bench/CONFORMANCE.md and bench/results/autobahn.json.
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, Process, free_port, wait_port  # noqa: E402
from report import machine, replace_section, set_summary_row  # noqa: E402
from websockets import nginx_version, start_nginx, start_switchyard  # noqa: E402

SECTION = "## WebSocket conformance: Autobahn|Testsuite (bench/conformance/autobahn_testsuite.py)"
PASSING = ("OK", "NON-STRICT", "INFORMATIONAL")
# wstest needs a name it can resolve; both proxies route it to the echo backend.
DOMAIN = "localhost"
AGENTS = (("switchyard", "Switchyard", start_switchyard), ("nginx", "nginx", start_nginx))


def run_suite(venv, work, cases):
    backend_port = free_port()
    backend = Process("autobahn-echo", [str(venv / "bin" / "python"),
                                         str(Path(__file__).resolve().parent / "autobahn_echo.py"),
                                         str(backend_port)], work)
    proxies = []
    try:
        wait_port(backend_port)
        servers = []
        for agent, _, start in AGENTS:
            proxy, port = start(work, backend_port, DOMAIN)
            proxies.append(proxy)
            servers.append({"agent": agent, "url": f"ws://{DOMAIN}:{port}"})
        spec = work / "fuzzingclient.json"
        spec.write_text(json.dumps({"outdir": str(work / "reports"), "servers": servers,
                                    "cases": cases, "exclude-cases": [], "exclude-agent-cases": {}}))
        started = time.time()
        with open(work / "wstest.log", "w") as log:
            subprocess.run([str(venv / "bin" / "wstest"), "-m", "fuzzingclient", "-s", str(spec)],
                           cwd=work, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=3 * 3600)
        took = time.time() - started
        alive = {agent: proxy.proc.poll() is None for (agent, _, _), proxy in zip(AGENTS, proxies)}
    finally:
        for proxy in proxies:
            proxy.stop()
        backend.stop()
    index = json.loads((work / "reports" / "index.json").read_text())
    return index, took, alive


def summarize(index, alive):
    results = {}
    for agent, _, _ in AGENTS:
        cases = index[agent]
        failed = sorted((case for case, r in cases.items() if r["behavior"] not in PASSING),
                        key=lambda c: [int(n) for n in c.split(".")])
        results[agent] = {
            "cases": len(cases),
            "behavior": dict(collections.Counter(r["behavior"] for r in cases.values())),
            "close_behavior": dict(collections.Counter(r["behaviorClose"] for r in cases.values())),
            "failed": {case: cases[case]["behavior"] for case in failed},
            "alive_after": alive[agent],
        }
    return results


def write_section(results):
    def counts(r, key):
        return ", ".join(f"{name} {n}" for name, n in sorted(r[key].items()))

    lines = [
        SECTION, "",
        f"Measured on {results['date']}, {results['machine']}. Autobahn|Testsuite "
        f"{results['autobahn']} (`wstest -m fuzzingclient`, cases `{', '.join(results['cases'])}`), "
        "through each proxy to the same echo backend (Autobahn's echo server with "
        "permessage-deflate, bench/conformance/autobahn_echo.py); one run, "
        f"{results['seconds'] / 60:.0f} min. Target: no case FAILED (OK, NON-STRICT and "
        "INFORMATIONAL pass).", "",
        f"| | Switchyard | nginx {results['nginx_version']} |", "|---|---|---|",
    ]
    s, n = results["switchyard"], results["nginx"]
    lines += [
        f"| cases run | {s['cases']} | {n['cases']} |",
        f"| behaviour | {counts(s, 'behavior')} | {counts(n, 'behavior')} |",
        f"| closing behaviour | {counts(s, 'close_behavior')} | {counts(n, 'close_behavior')} |",
        f"| FAILED or UNIMPLEMENTED | {len(s['failed'])} | {len(n['failed'])} |",
        f"| proxy still running after | {'yes' if s['alive_after'] else 'no'} | {'yes' if n['alive_after'] else 'no'} |",
        "",
    ]
    for agent, name, _ in AGENTS:
        failed = results[agent]["failed"]
        if failed:
            lines.append(f"- {name}, not passed: " + ", ".join(f"{c} ({b})" for c, b in failed.items()))
    met = not s["failed"] and s["cases"] > 0
    lines.append(f"- Target no FAILED through Switchyard: **{'met' if met else 'NOT met'}**.")
    replace_section(SECTION, lines)

    def verdict(r):
        b = r["behavior"]
        return (f"{b.get('OK', 0)} OK, {b.get('NON-STRICT', 0)} non-strict, "
                f"{b.get('INFORMATIONAL', 0)} informational, {len(r['failed'])} failed "
                f"of {r['cases']}")
    set_summary_row("Autobahn Testsuite, all cases (section below)", [verdict(s), verdict(n)])


def rewrite_report():
    """Writes the report again from bench/results/autobahn.json (no run)."""
    write_section(json.loads((ROOT / "bench" / "results" / "autobahn.json").read_text()))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["*"],
                        help="Autobahn case patterns (default: all)")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report from the last results, without running")
    args = parser.parse_args()
    if args.report_only:
        rewrite_report()
        return 0
    venv = Path(os.environ.get("AUTOBAHN_VENV", ""))
    if not (venv / "bin" / "wstest").exists():
        raise SystemExit("AUTOBAHN_VENV must name a Python 2.7 environment with "
                         "bench/conformance/autobahn-requirements.txt installed")
    version = subprocess.run([str(venv / "bin" / "wstest"), "-a"], capture_output=True, text=True).stdout
    work = Path(tempfile.mkdtemp(prefix="switchyard-autobahn-"))
    try:
        index, took, alive = run_suite(venv, work, args.cases)
        results = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(),
            "autobahn": next((l.split()[-1] for l in version.splitlines() if "TestSuite" in l), "0.8.2"),
            "nginx_version": nginx_version(),
            "cases": args.cases,
            "seconds": took,
            **summarize(index, alive),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (ROOT / "bench" / "results" / "autobahn.json").write_text(json.dumps(results, indent=2) + "\n")
    write_section(results)
    print(json.dumps({k: v for k, v in results.items() if k in ("switchyard", "nginx")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
