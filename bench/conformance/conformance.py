#!/usr/bin/env python3
"""Conformance and security scans of Switchyard beside nginx, on this machine, in one run.

- HTTP/2: h2spec (all 145 cases) against each TLS listener (ALPN h2) and each cleartext
  HTTP/2 listener (prior knowledge).
- TLS: sslyze's check against Mozilla's "intermediate" profile, and testssl.sh's findings
  by severity, for a per-app certificate chosen by SNI (Switchyard: uploaded through the
  admin API; nginx: its server block), issued by a CA made for the run.
- Slow clients: slowhttptest's slow headers, slow body and slow read attacks, each holding
  up to 2,000 connections for 30 s on one app, while probe clients send a GET every 100 ms
  on a new connection to that app and to another app with its own backend: how many probes
  were answered (within 2 s) and their p99. The first shows what reaches the app's backend
  (both proxies share it), the second whether the proxy itself stays available.
- Request smuggling: the raw-socket suite (tests/smuggling.rs) against the router; its
  cases are counted from its own report.

Both proxies front the same backend (python's http.server), listen on 127.0.0.1 only, and
are stopped by PID at the end. nginx is configured as Mozilla's generator suggests for the
intermediate profile (the set-up a platform team would compare against). Results go to
bench/CONFORMANCE.md and bench/results/conformance.json.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import http.client
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import BIN, ROOT, Process, Started, free_port, put_app, wait_port  # noqa: E402
from report import written_by_other_scripts  # noqa: E402

H2SPEC = shutil.which("h2spec") or str(Path.home() / "go" / "bin" / "h2spec")
SSLYZE_PYTHON = os.environ.get("SSLYZE_PYTHON", "python3")
DOMAIN = "localhost"  # resolves without DNS; h2spec and the scanners send it as SNI
OTHER_DOMAIN = "other.test"  # a second app on its own backend, probed during the slow-client attacks
HSTS_MAX_AGE_S = 63072000  # Mozilla's recommendation; both proxies add it to every answer

# testssl.sh findings that judge what the app or the domain serves, not the TLS endpoint.
NOT_ABOUT_THE_PROXY = {
    "security_headers": " (the app's own response headers: X-Frame-Options, CSP, ...)",
    "DNS_CAArecord": " (a DNS record of the domain)",
}

MOZILLA_INTERMEDIATE_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384:DHE-RSA-CHACHA20-POLY1305"
)


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def serial():
    """A positive 128-bit serial number, as CAs issue them."""
    raw = bytearray(os.urandom(16))
    raw[0] = (raw[0] & 0x7F) | 0x40
    return "0x" + raw.hex()


def make_pki(work):
    """A CA with the extensions validators require, and a P-256 certificate for DOMAIN shaped
    like a publicly trusted one (90 days, random 128-bit serial, a CRL location), so that the
    scanners' certificate checks judge a realistic certificate, not a toy one. The CRL is
    never fetched."""
    ca_key, ca, key, csr, cert = (work / n for n in ("ca.key", "ca.pem", "leaf.key", "leaf.csr", "leaf.pem"))
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", ca_key, "-out", ca, "-days", "365", "-subj", "/CN=Switchyard conformance CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={DOMAIN}")
    ext = work / "leaf.ext"
    ext.write_text(f"subjectAltName=DNS:{DOMAIN}\nextendedKeyUsage=serverAuth\n"
                   "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
                   "crlDistributionPoints=URI:http://ca.conformance.invalid/ca.crl\n")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-set_serial", serial(),
            "-out", cert, "-days", "90", "-extfile", ext)
    return ca, cert, key


def start_backend(work, procs, name="backend"):
    port = free_port()
    root = work / f"site-{name}"
    root.mkdir()
    (root / "index.html").write_text("conformance backend\n")
    # Slow reads need answers larger than the socket buffers they are meant to fill.
    (root / "big.bin").write_bytes(os.urandom(1 << 20))
    procs.append(Process(name, ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                     "--directory", str(root)], work))
    wait_port(port)
    return port


def start_switchyard(work, procs, backend, other_backend, cert, key):
    http, https, admin = free_port(), free_port(), free_port()
    procs.append(Process("switchyard", [
        str(BIN), "serve", "--http", f"127.0.0.1:{http}", "--https", f"127.0.0.1:{https}",
        "--admin", f"127.0.0.1:{admin}", "--data-dir", str(work / "switchyard-data"),
        "--access-log", "off", "--waf", "off", "--shutdown-grace-s", "0",
    ], work, env={**os.environ, "RUST_LOG": "warn"}))
    for port in (http, https, admin):
        wait_port(port)
    admin_url = f"http://127.0.0.1:{admin}"
    put_app(admin, "conformance", {"domains": [DOMAIN], "backends": [f"127.0.0.1:{backend}"],
                                       "hsts": {"max_age_s": HSTS_MAX_AGE_S}})
    put_app(admin, "other", {"domains": [OTHER_DOMAIN], "backends": [f"127.0.0.1:{other_backend}"]})
    subprocess.run([str(BIN), "certs", "put", DOMAIN, "--cert", str(cert), "--key", str(key),
                    "--admin", admin_url], check=True, capture_output=True)
    return {"tls": https, "h2c": http, "http1": http}


def start_nginx(work, procs, backend, other_backend, cert, key):
    tls, h2c, plain = free_port(), free_port(), free_port()
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes 2;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
worker_rlimit_nofile 16384;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    upstream backend {{ server 127.0.0.1:{backend}; keepalive 16; }}
    upstream other {{ server 127.0.0.1:{other_backend}; keepalive 16; }}
    # Mozilla SSL configuration generator, intermediate profile, nginx 1.22 / OpenSSL 3.
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_ciphers {MOZILLA_INTERMEDIATE_CIPHERS};
    ssl_prefer_server_ciphers off;
    ssl_ecdh_curve X25519:prime256v1:secp384r1;
    ssl_session_timeout 1d;
    ssl_session_cache shared:conformance:10m;
    ssl_session_tickets off;
    server {{
        listen 127.0.0.1:{tls} ssl http2;
        server_name {DOMAIN};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        add_header Strict-Transport-Security "max-age={HSTS_MAX_AGE_S}" always;
        location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    }}
    server {{
        listen 127.0.0.1:{plain};
        server_name {DOMAIN};
        location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    }}
    server {{
        listen 127.0.0.1:{plain};
        server_name {OTHER_DOMAIN};
        location / {{ proxy_pass http://other; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    }}
    server {{
        listen 127.0.0.1:{h2c} http2;
        server_name {DOMAIN};
        location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    }}
}}
""")
    procs.append(Process("nginx", ["nginx", "-c", str(conf), "-p", str(work)], work))
    for port in (tls, h2c, plain):
        wait_port(port)
    return {"tls": tls, "h2c": h2c, "http1": plain}


def h2spec(port, tls):
    args = [H2SPEC, "-h", DOMAIN, "-p", str(port), "-o", "5"] + (["-t", "-k"] if tls else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=600).stdout
    summary = re.search(r"(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed", out)
    if not summary:
        raise RuntimeError(f"h2spec printed no summary:\n{out[-2000:]}")
    total, passed, skipped, failed = map(int, summary.groups())
    failures_text = out.split("Failures:", 1)[1] if "Failures:" in out else ""
    failures = [line.strip()[2:].strip() for line in failures_text.splitlines() if line.strip().startswith("×")]
    return {"total": total, "passed": passed, "skipped": skipped, "failed": failed, "failures": failures}


def sslyze(port, ca):
    run = subprocess.run([SSLYZE_PYTHON, "-m", "sslyze", "--mozilla_config=intermediate",
                          "--certinfo_ca_file", str(ca), f"{DOMAIN}:{port}"],
                         capture_output=True, text=True, timeout=600)
    compliance = run.stdout.split("COMPLIANCE AGAINST TLS CONFIGURATION", 1)[-1]
    problems = [line.strip()[2:] for line in compliance.splitlines() if line.strip().startswith("* ")]
    compliant = run.returncode == 0 and "OK - Compliant" in compliance
    return {"compliant": compliant, "problems": problems}


def testssl(port, ca, work, tag):
    report = work / f"testssl-{tag}.json"
    subprocess.run(["testssl", "--quiet", "--color", "0", "--warnings", "off", "--add-ca", str(ca),
                    "--jsonfile", str(report), f"{DOMAIN}:{port}"],
                   capture_output=True, text=True, timeout=1200)
    findings = json.loads(report.read_text())
    by_severity = {}
    notable = []
    for finding in findings:
        severity = finding.get("severity", "INFO")
        by_severity[severity] = by_severity.get(severity, 0) + 1
        if severity in ("LOW", "MEDIUM", "HIGH", "CRITICAL"):
            about = NOT_ABOUT_THE_PROXY.get(finding.get("id"), "")
            notable.append(f"{severity} {finding.get('id')}: {finding.get('finding')}{about}")
    return {"by_severity": by_severity, "notable": notable}


SLOW_CONNECTIONS = 2000
SLOW_SECONDS = 30
SLOW_ATTACKS = {
    # slowhttptest's three classic attacks, each holding up to SLOW_CONNECTIONS connections.
    "slow headers": ["-H", "-i", "10"],
    "slow body": ["-B", "-i", "10", "-s", "65536"],
    "slow read": ["-X", "-k", "10", "-n", "5", "-w", "16", "-y", "32", "-z", "32"],
}


SLOW_PATHS = {"slow read": "/big.bin"}


class Probe(threading.Thread):
    """A well-behaved client during an attack: a new connection and a GET every 100 ms,
    answered within 2 s or counted as failed."""

    def __init__(self, port, host):
        super().__init__(daemon=True)
        self.port, self.host, self.ok, self.failed, self.latencies = port, host, 0, 0, []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            started = time.monotonic()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/", headers={"Host": self.host})
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    self.ok += 1
                    self.latencies.append(time.monotonic() - started)
                else:
                    self.failed += 1
            except OSError:
                self.failed += 1
            self.halt.wait(max(0.0, 0.1 - (time.monotonic() - started)))


def slow_clients(port, work, tag):
    results = {}
    for attack, flags in SLOW_ATTACKS.items():
        probes = {"same app": Probe(port, DOMAIN), "other app": Probe(port, OTHER_DOMAIN)}
        for probe in probes.values():
            probe.start()
        prefix = work / f"slow-{tag}-{attack.replace(' ', '-')}"
        run = subprocess.run(["slowhttptest", *flags, "-c", str(SLOW_CONNECTIONS), "-r", "500",
                              "-l", str(SLOW_SECONDS), "-u", f"http://{DOMAIN}:{port}{SLOW_PATHS.get(attack, '/')}", "-p", "3",
                              "-g", "-o", str(prefix)],
                             capture_output=True, text=True, timeout=SLOW_SECONDS + 120)
        for probe in probes.values():
            probe.halt.set()
            probe.join()
        held = 0
        csv = prefix.with_suffix(".csv")
        if csv.exists():
            rows = [line.split(",") for line in csv.read_text().splitlines()[1:] if line.strip()]
            held = max((int(r[3]) for r in rows if len(r) > 3 and r[3].strip().isdigit()), default=0)
        results[attack] = {"most_connections_held": held, "slowhttptest_exit": run.returncode}
        for which, probe in probes.items():
            latencies = sorted(probe.latencies)
            p99 = latencies[int(len(latencies) * 0.99) - 1] if latencies else None
            total = probe.ok + probe.failed
            results[attack][which] = {
                "ok": probe.ok, "failed": probe.failed,
                "available_pct": round(100.0 * probe.ok / total, 1) if total else 0.0,
                "p99_ms": round(p99 * 1000, 1) if p99 is not None else None,
            }
        print(f"{tag} {attack}: {results[attack]}", flush=True)
    return results


def smuggling_suite():
    run = subprocess.run(["cargo", "test", "--release", "--locked", "--test", "smuggling", "--",
                          "--nocapture", "--test-threads=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200)
    report = run.stdout + run.stderr
    http1 = len(re.findall(r": \[[\d, ]*\] \[", report))
    http2 = len(re.findall(r": (?:(?:Reset|GoAway|Answered)\(\d+\)|Silence)$", report, re.M))
    passed = re.search(r"test result: ok\. (\d+) passed", report) is not None
    return {"http1_cases": http1, "http2_cases": http2, "all_refused_or_normalised": passed}


def write_report(results):
    when = results["date"]
    sw, ng = results["switchyard"], results["nginx"]
    lines = [
        "# Conformance (bench/conformance)",
        "",
        f"Measured on {when}, {results['machine']}. Same run, same backend, same certificate "
        f"(a P-256 certificate for `{DOMAIN}` from a CA made for the run; Switchyard serves it "
        "from its store by SNI). Regenerate with `bench/conformance/run`.",
        "",
        "| check | Switchyard | nginx " + results["nginx_version"] + " |",
        "|---|---|---|",
    ]

    def h2(r):
        return f"{r['passed']}/{r['total']}"

    def sev(r):
        counts = r["by_severity"]
        return ", ".join(f"{k} {counts[k]}" for k in ("CRITICAL", "HIGH", "MEDIUM", "LOW") if counts.get(k)) or "none above INFO"

    lines += [
        f"| h2spec over TLS (ALPN h2) | {h2(sw['h2spec_tls'])} | {h2(ng['h2spec_tls'])} |",
        f"| h2spec cleartext (prior knowledge) | {h2(sw['h2spec_h2c'])} | {h2(ng['h2spec_h2c'])} |",
        f"| sslyze, Mozilla intermediate | {'compliant' if sw['sslyze']['compliant'] else 'NOT compliant'} | "
        f"{'compliant' if ng['sslyze']['compliant'] else 'NOT compliant'} |",
        f"| testssl.sh findings (LOW and above) | {sev(sw['testssl'])} | {sev(ng['testssl'])} |",
    ]
    for attack in SLOW_ATTACKS:
        for which in ("same app", "other app"):
            cells = []
            for r in (sw, ng):
                a = r["slow_clients"][attack]
                cells.append(f"{a[which]['available_pct']}% answered, p99 {a[which]['p99_ms']} ms "
                             f"({a['most_connections_held']} attack connections held)")
            lines.append(f"| {attack} ({SLOW_CONNECTIONS} connections, {SLOW_SECONDS} s): probe of the {which} "
                         f"| {cells[0]} | {cells[1]} |")
    sm = results["smuggling"]
    lines += [
        f"| request smuggling (tests/smuggling.rs) | {sm['http1_cases']} HTTP/1 + {sm['http2_cases']} HTTP/2 cases: "
        f"{'all refused or normalised' if sm['all_refused_or_normalised'] else 'FAILURES, see cargo test --test smuggling'} | not run |",
        "",
    ]
    for name, r in (("Switchyard", sw), ("nginx", ng)):
        details = []
        for key, label in (("h2spec_tls", "h2spec TLS"), ("h2spec_h2c", "h2spec cleartext")):
            for failure in r[key]["failures"]:
                details.append(f"- {label} failed: {failure}")
        details += [f"- sslyze: {p}" for p in r["sslyze"]["problems"]]
        details += [f"- testssl: {n}" for n in r["testssl"]["notable"]]
        lines += [f"## {name}: what did not pass", ""] + (details or ["- nothing"]) + [""]
    lines += [
        "## Targets (issue 9)",
        "",
        f"- h2spec 145/145: over TLS **{h2(sw['h2spec_tls'])}**, cleartext **{h2(sw['h2spec_h2c'])}** "
        "(the cleartext listener also speaks HTTP/1.1, so an invalid preface is read as an HTTP/1 "
        "request and answered 400 rather than the connection closed)",
        f"- sslyze compliant: **{'met' if sw['sslyze']['compliant'] else 'NOT met'}**",
        "- no HIGH or CRITICAL testssl finding: **"
        + ("met" if not (sw["testssl"]["by_severity"].get("HIGH") or sw["testssl"]["by_severity"].get("CRITICAL")) else "NOT met")
        + "**",
        f"- every smuggling case refused or normalised: **{'met' if sm['all_refused_or_normalised'] else 'NOT met'}**",
        "- service stays available under slow clients (every probe of the attacked app and of another app answered): **"
        + ("met" if all(sw["slow_clients"][a][w]["failed"] == 0 for a in SLOW_ATTACKS for w in ("same app", "other app"))
           else "NOT met") + "**",
        "- Fuzzing: `fuzz/run` (cargo-fuzz, nightly), results in fuzz/RESULTS.md.",
        "- Binary upgrade under load: `tests/upgrade.rs` (in CI) hands the listeners to a new process while clients send requests on new and keep-alive connections: no failed request. WebSockets held, backend faults (toxiproxy) and schemathesis against the admin API: the sections below.",
        "- Autobahn, WebSockets held, unknown-host floods: their sections below.",
        "",
    ]
    rows, sections = written_by_other_scripts()
    table_end = lines.index("", lines.index("|---|---|---|"))
    lines[table_end:table_end] = rows
    (ROOT / "bench" / "CONFORMANCE.md").write_text("\n".join(lines) + ("\n" + sections + "\n" if sections else ""))


def main():
    work = Path(tempfile.mkdtemp(prefix="switchyard-conformance-"))
    with Started() as procs:
        ca, cert, key = make_pki(work)
        backend = start_backend(work, procs)
        other_backend = start_backend(work, procs, "other-backend")
        ports = {"switchyard": start_switchyard(work, procs, backend, other_backend, cert, key),
                 "nginx": start_nginx(work, procs, backend, other_backend, cert, key)}
        results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        for name, p in ports.items():
            results[name] = {
                "h2spec_tls": h2spec(p["tls"], tls=True),
                "h2spec_h2c": h2spec(p["h2c"], tls=False),
                "sslyze": sslyze(p["tls"], ca),
                "testssl": testssl(p["tls"], ca, work, name),
                "slow_clients": slow_clients(p["http1"], work, name),
            }
            print(f"{name}: h2spec TLS {results[name]['h2spec_tls']['passed']}/{results[name]['h2spec_tls']['total']}, "
                  f"cleartext {results[name]['h2spec_h2c']['passed']}/{results[name]['h2spec_h2c']['total']}, "
                  f"sslyze {'compliant' if results[name]['sslyze']['compliant'] else 'not compliant'}, "
                  f"testssl {results[name]['testssl']['by_severity']}", flush=True)
    results["smuggling"] = smuggling_suite()
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), "cpu")
    results["machine"] = f"{cpu}, {os.cpu_count()} cores, kernel {os.uname().release}"
    results["nginx_version"] = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip().split("/")[-1]
    results["switchyard_commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                                  capture_output=True, text=True).stdout.strip()
    (ROOT / "bench" / "results" / "conformance.json").write_text(json.dumps(results, indent=2) + "\n")
    write_report(results)
    print(f"wrote {ROOT / 'bench' / 'CONFORMANCE.md'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
