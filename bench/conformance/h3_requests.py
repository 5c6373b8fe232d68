#!/usr/bin/env python3
"""HTTP/3 requests, well formed and malformed (RFC 9114), sent by a client not written
here (aioquic's, tests/h3_client.py) to Switchyard and to Caddy (Debian's, reverse_proxy),
each in front of the same origin, which counts what reaches it. A malformed request passes
when the client gets no 2xx and the origin never sees it whole.

    python3 bench/conformance/h3_requests.py

Needs target/release/switchyard, caddy, and aioquic in target/h3-venv (scripts/test makes
it). Everything listens on 127.0.0.1; every process is stopped by its PID. Writes its
section of bench/CONFORMANCE.md.
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # this folder's report.py before bench/'s
import bench  # noqa: E402
import report  # noqa: E402
import http3 as h3bench  # noqa: E402  (bench/http3.py: the certificate and Caddy)

TITLE = "## HTTP/3 requests by RFC 9114 section (bench/conformance/h3_requests.py)"
PYTHON = bench.ROOT / "target" / "h3-venv" / "bin" / "python3"
CLIENT = bench.ROOT / "tests" / "h3_client.py"
HOST = h3bench.HOST

ORIGIN = """
import http.server, json, sys
SEEN = []
class Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/seen":
            return self.answer(json.dumps(SEEN).encode())
        SEEN.append([self.command, self.path, 0])
        self.answer(b"ok")
    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        got = len(self.rfile.read(length))
        SEEN.append([self.command, self.path, got])
        self.answer(str(got).encode())
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Origin).serve_forever()
"""

# (section, case, client arguments, malformed, what the origin must have seen for a pass)
CASES = [
    ("4.1", "GET", ["--path", "/get"], False, None),
    ("4.1", "POST, a 1 MiB body", ["--method", "POST", "--path", "/upload", "--body-bytes", "1048576"],
     False, 1048576),
    ("4.2", "a Connection field", ["--path", "/connection", "--header", "connection: close"], True, None),
    ("4.2", "Keep-Alive", ["--path", "/keep-alive", "--header", "keep-alive: 5"], True, None),
    ("4.2", "Transfer-Encoding", ["--path", "/te-chunked", "--header", "transfer-encoding: chunked"],
     True, None),
    ("4.2", "Upgrade", ["--path", "/upgrade", "--header", "upgrade: websocket"], True, None),
    ("4.2", "TE other than trailers", ["--path", "/te-gzip", "--header", "te: gzip"], True, None),
    ("4.2", "TE: trailers (allowed)", ["--path", "/te-trailers", "--header", "te: trailers"], False, None),
    ("4.1.2", "body shorter than Content-Length",
     ["--method", "POST", "--path", "/short", "--body-bytes", "5", "--declared-length", "10"], True, None),
    ("4.1.2", "body longer than Content-Length",
     ["--method", "POST", "--path", "/long", "--body-bytes", "10", "--declared-length", "5"], True, None),
    # RFC 9220 §3 (after RFC 8441 §4): `:protocol` from a client the server never sent
    # SETTINGS_ENABLE_CONNECT_PROTOCOL is malformed.
    ("RFC 9220 §3", "extended CONNECT (WebSocket) unannounced",
     ["--method", "CONNECT", "--path", "/chat", "--header", ":protocol: websocket",
      "--header", "sec-websocket-version: 13"], True, None),
]


def ask(port, args, ca):
    out = subprocess.run([str(PYTHON), str(CLIENT), "--port", str(port), "--server-name", HOST,
                          "--ca", str(ca), *args], capture_output=True, text=True, timeout=60).stdout
    try:
        return json.loads(out)
    except ValueError:
        return {"error": out.strip()[:80] or "no answer"}


def seen(origin_port):
    status, body = bench.get(origin_port, "origin", "/seen")
    return json.loads(body) if status == 200 else []


def whole(record, args):
    """Whether the origin got the request whole: a body of the length its head declared,
    or, without a body, the request at all."""
    if "--declared-length" in args:
        return record[2] == int(args[args.index("--declared-length") + 1])
    return True


def outcome(answer):
    if "reset" in answer:
        return f"stream reset {answer['reset']:#x}"
    if "closed" in answer:
        return f"connection closed {answer['closed']:#x}"
    if "error" in answer:
        return answer["error"]
    return str(answer.get("status"))


def main():
    work = Path(tempfile.mkdtemp(prefix="conformance-h3-"))
    cert, key = h3bench.certificate(work)
    (work / "origin.py").write_text(ORIGIN)
    rows = []
    with bench.Started() as procs:
        origin_port = bench.free_port()
        procs.append(bench.Process("origin", [sys.executable, str(work / "origin.py"), str(origin_port)], work))
        bench.wait_port(origin_port)
        tls_port, h3_port = bench.free_port(), bench.free_port()
        router, _, admin = bench.serve_switchyard(
            work, "switchyard", "--https", f"127.0.0.1:{tls_port}", "--http3", f"127.0.0.1:{h3_port}",
            "--default-cert", str(cert), "--default-key", str(key), "--waf", "off")
        procs.append(router)
        bench.put_app(admin, "conformance", {"domains": [HOST], "backends": [f"127.0.0.1:{origin_port}"]})
        caddy, caddy_port = h3bench.start_caddy(work, origin_port, cert, key)
        procs.append(caddy)
        # The listener may still be loading certificates: its first answer is waited for.
        for _ in range(5):
            if ask(h3_port, ["--path", "/warm"], cert).get("status") == 200:
                break
            time.sleep(0.2)
        fronts = [("Switchyard", h3_port), ("Caddy", caddy_port)]
        passed = {name: 0 for name, _ in fronts}
        for section, case, args, malformed, body_seen in CASES:
            cells = []
            for name, port in fronts:
                path = args[args.index("--path") + 1]
                tagged = [*args[:args.index("--path") + 1], f"{path}-{name.lower()}",
                          *args[args.index("--path") + 2:]]
                answer = ask(port, tagged, cert)
                time.sleep(0.2)
                reached = [s for s in seen(origin_port) if s[1] == f"{path}-{name.lower()}"]
                status = answer.get("status")
                if malformed:
                    ok = not (isinstance(status, int) and 200 <= status < 300) and not any(
                        whole(record, args) for record in reached)
                else:
                    ok = status == 200 and (body_seen is None or any(s[2] == body_seen for s in reached))
                passed[name] += ok
                cells.append(f"{'pass' if ok else 'FAIL'}: {outcome(answer)}"
                             f"{', reached the origin' if reached else ''}")
            rows.append(f"| {section} | {case} | {'malformed' if malformed else 'valid'} | "
                        + " | ".join(cells) + " |")
    lines = [
        TITLE,
        "",
        f"Measured on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {report.machine()}; "
        f"Switchyard at {subprocess.run(['git', '-C', str(bench.ROOT), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}, "
        f"Caddy {h3bench.caddy_version()} (Debian, reverse_proxy), both in front of one origin that records what "
        "reaches it; client aioquic 1.7.2. A malformed request passes when the client gets no 2xx and the "
        "origin never receives it whole.",
        "",
        f"Switchyard {passed['Switchyard']}/{len(CASES)}, Caddy {passed['Caddy']}/{len(CASES)}.",
        "",
        "| RFC 9114 § | request | kind | Switchyard | Caddy |",
        "|---|---|---|---|---|",
        *rows,
    ]
    print("\n".join(lines))
    report.replace_section(TITLE, lines)


if __name__ == "__main__":
    main()
