#!/usr/bin/env python3
"""schemathesis against the admin API, driven by the API's own OpenAPI document
(GET /v1/openapi.json): generated valid and invalid requests for every operation, checked
for server errors, undocumented status codes, content types and response shapes.

The router runs on the embedded store with an admin token, on 127.0.0.1, stopped by PID.
Not checked: `positive_data_acceptance` (that every request the schema allows is accepted):
the API validates meaning the schema's types cannot carry (a backend is an ip:port that can
be connected to, a domain is made of DNS labels, a domain belongs to one app), so random
schema-valid strings are rightly refused.

Results: the "Admin API" section of bench/CONFORMANCE.md and
bench/results/api_schema.json.
"""

import argparse
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
from bench import ROOT, serve_switchyard  # noqa: E402
from report import machine, replace_section  # noqa: E402

SECTION = "## Admin API (bench/conformance/api_schema.py)"
TOKEN = "schemathesis-token"
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "missing_required_header",
    "unsupported_method",
    "use_after_free",
    "ensure_resource_availability",
    "ignored_auth",
]


def schemathesis_version(st):
    out = subprocess.run([st, "--version"], capture_output=True, text=True).stdout
    return out.strip().split()[-1] if out else "unknown"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-examples", type=int, default=100)
    parser.add_argument("--schemathesis", default=os.environ.get("SCHEMATHESIS", "schemathesis"))
    parser.add_argument("--binary", help="the switchyard binary (default: the release build)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="switchyard-api-"))
    router, _, admin = serve_switchyard(work, "switchyard", "--waf", "off", "--admin-token", TOKEN,
                                        binary=args.binary)
    try:
        report = work / "report.json"
        started = time.time()
        run = subprocess.run([
            args.schemathesis, "run", f"http://127.0.0.1:{admin}/v1/openapi.json",
            "--checks", ",".join(CHECKS), "--max-examples", str(args.max_examples),
            "--seed", "1", "--workers", "2", "-H", f"Authorization: Bearer {TOKEN}",
            "--phases", "examples,coverage,fuzzing,stateful",
            "--report", "json", "--report-json-path", str(report),
        ], capture_output=True, text=True, cwd=work)  # its cache goes with `work`
        elapsed = time.time() - started
        output = run.stdout + run.stderr
        (ROOT / "bench" / "results" / "api_schema.log").write_text(output)
        alive = router.proc.poll() is None
    finally:
        router.stop()
        shutil.rmtree(work, ignore_errors=True)
    # The tail of schemathesis' report, without the paths of files removed with `work`.
    summary = [l for l in output.splitlines()
               if l.strip() and "Reports:" not in l and str(work) not in l][-10:]
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "schemathesis": schemathesis_version(args.schemathesis),
        "exit_code": run.returncode,
        "seconds": round(elapsed, 1),
        "max_examples": args.max_examples,
        "checks": CHECKS,
        "router_alive_after": alive,
        "summary": summary,
    }
    (ROOT / "bench" / "results" / "api_schema.json").write_text(json.dumps(results, indent=2) + "\n")
    verdict = "no failure" if run.returncode == 0 else f"FAILURES (exit {run.returncode})"
    lines = [
        SECTION, "",
        f"Measured on {results['date']}, {results['machine']}: schemathesis {results['schemathesis']} against "
        f"`GET /v1/openapi.json`, all phases (examples, coverage, fuzzing, stateful), up to "
        f"{args.max_examples} cases per operation, seed 1, {elapsed:.0f} s. Checks: "
        + ", ".join(f"`{c}`" for c in CHECKS) + ".", "",
        f"Result: **{verdict}**; the router {'kept running' if alive else 'DIED'}. Full output: "
        "`bench/results/api_schema.log`. Its summary:", "", "```", *summary, "```",
    ]
    replace_section(SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
