#!/usr/bin/env python3
"""The garden (issue 46, item 4b): origins built on other HTTP/1 parsers placed behind a
front — Switchyard's own HTTP/1 codec (h1-floor, crates/h1) and Switchyard itself
(crates/h1 on both sides since 364efdd; hyper's server for the client before) — each fed
the smuggling corpus of tests/smuggling.rs plus mutations of its framing fields in the
spellings where parsers are known to part (the HTTP Garden's published findings:
whitespace and control bytes around `chunked`, signs and lists in Content-Length,
chunk-size prefixes and extensions, bare LF and CR).

A front smuggles when an origin reads a request the front did not forward. So for every
case, on a fresh client connection through a front that keeps one pooled connection to
the origin, the garden compares:
- the requests the origin's parser read (each origin prints one line per request it
  handed to its application: method, target, body length), and
- the answers the client got from the origin through the front (the origin answers with
  the same line);
they must be the same requests. Then a victim request on a new connection must get its
own answer (a request left in the pooled connection would answer it instead). A front
may refuse a case (4xx) or forward it normalised; what it forwards, the origin must read
as it did.

    python3 bench/conformance/garden.py [--front h1-floor] [--front switchyard]
        [--origin go] … [--quick]

Origins: Go's net/http, Node's http (llhttp), gunicorn, nginx, HAProxy. The fronts need
`cargo build --release` (Switchyard) and the engines' build (h1-floor): bench/run builds
both. Writes the garden's section of bench/CONFORMANCE.md. Everything listens on
127.0.0.1; every process is stopped by its PID.
"""

import argparse
import concurrent.futures
import os
import re
import shutil
import socket
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
from bench import ROOT, Process, free_port, put_app, wait_port  # noqa: E402

HOST = "garden.test"
GARDEN = HERE / "garden"
TITLE = "## The garden: other parsers behind the front, issue 46 (bench/conformance/garden.py)"
ORIGIN_LINE = re.compile(rb"^[A-Za-z]+ \S* (\d+|-|bad-body)\n$")
VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "switchyard-garden-venv"


# ------------------------------------------------------------------ the corpus

def smuggled():
    return f"GET /smuggled HTTP/1.1\r\nHost: {HOST}\r\nX: "


def chunk_of(data):
    return f"{len(data):x}\r\n{data}\r\n0\r\n\r\n"


def base_cases():
    """tests/smuggling.rs's HTTP/1 cases, the same bytes (host aside)."""
    s = smuggled()
    chunk = chunk_of(s)
    h = f"Host: {HOST}\r\n"
    return [
        ("CL.TE", f"POST / HTTP/1.1\r\n{h}Content-Length: {5 + len(s)}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{s}"),
        ("TE.CL", f"POST / HTTP/1.1\r\n{h}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}"),
        ("conflicting Content-Length", f"POST / HTTP/1.1\r\n{h}Content-Length: 5\r\nContent-Length: 40\r\n\r\nhello{s}"),
        ("Content-Length list with different values", f"POST / HTTP/1.1\r\n{h}Content-Length: 5, 40\r\n\r\nhello{s}"),
        ("duplicate identical Content-Length", f"POST / HTTP/1.1\r\n{h}Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
        ("Content-Length with a sign", f"POST / HTTP/1.1\r\n{h}Content-Length: +5\r\n\r\nhello"),
        ("negative Content-Length", f"POST / HTTP/1.1\r\n{h}Content-Length: -1\r\n\r\nhello"),
        ("Content-Length in hex", f"POST / HTTP/1.1\r\n{h}Content-Length: 0x5\r\n\r\nhello"),
        ("Content-Length named in Connection",
         f"POST / HTTP/1.1\r\n{h}Content-Length: {len(s) + 4}\r\nConnection: Content-Length\r\n\r\n{s}\r\n\r\n"),
        ("Transfer-Encoding named in Connection",
         f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\nConnection: Transfer-Encoding\r\n\r\n{chunk}"),
        ("Transfer-Encoding: xchunked", f"POST / HTTP/1.1\r\n{h}Content-Length: 4\r\nTransfer-Encoding: xchunked\r\n\r\n{chunk}"),
        ("Transfer-Encoding: chunked, identity", f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked, identity\r\n\r\n{chunk}"),
        ("Transfer-Encoding: identity, chunked", f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: identity, chunked\r\n\r\n{chunk}"),
        ("Transfer-Encoding split over two lines",
         f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}"),
        ("Transfer-Encoding chunked then a second line",
         f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n{chunk}"),
        ("Transfer-Encoding in upper case", f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: CHUNKED\r\n\r\n{chunk}"),
        ("space before the colon", f"POST / HTTP/1.1\r\n{h}Transfer-Encoding : chunked\r\nContent-Length: 4\r\n\r\n{chunk}"),
        ("vertical tab before chunked", f"POST / HTTP/1.1\r\n{h}Transfer-Encoding:\x0bchunked\r\nContent-Length: 4\r\n\r\n{chunk}"),
        ("Transfer-Encoding on HTTP/1.0", f"POST / HTTP/1.0\r\n{h}Transfer-Encoding: chunked\r\n\r\n{chunk}"),
        ("folded Transfer-Encoding line",
         f"POST / HTTP/1.1\r\n{h}Transfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n\r\n{chunk}"),
        ("folded header line", f"GET / HTTP/1.1\r\n{h}X-Folded: a\r\n b\r\n\r\n"),
        ("chunk size with 0x prefix", f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n{s}"),
        ("negative chunk size", f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n"),
        ("chunk size overflowing 64 bits",
         f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n{s}"),
        ("chunk data longer than its size", f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n"),
        ("bare LF in a chunk extension", f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5;\nxx\r\nhello\r\n0\r\n\r\n"),
        ("bare LF line ends", f"GET / HTTP/1.1\nHost: {HOST}\nX-A: b\n\n"),
        ("bare CR in a header value", f"GET / HTTP/1.1\r\n{h}X-A: a\rTransfer-Encoding: chunked\r\n\r\n"),
        ("NUL in a header value", f"GET / HTTP/1.1\r\n{h}X-A: a\0b\r\n\r\n"),
        ("space in a header name", f"GET / HTTP/1.1\r\n{h}Transfer Encoding: chunked\r\n\r\n"),
        ("non-token header name", f"GET / HTTP/1.1\r\n{h}X(A): b\r\n\r\n"),
        ("header line without a colon", f"GET / HTTP/1.1\r\n{h}Transfer-Encoding chunked\r\n\r\n"),
        ("two Host headers", f"GET / HTTP/1.1\r\n{h}Host: other.test\r\n\r\n"),
        ("absolute URI naming another host", f"GET http://other.test/ HTTP/1.1\r\n{h}\r\n"),
        ("request line with a tab", f"GET\t/ HTTP/1.1\r\n{h}\r\n"),
        ("target with a space", f"GET / /smuggled HTTP/1.1\r\n{h}\r\n"),
        ("h2c upgrade", f"GET / HTTP/1.1\r\n{h}Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
                        "Connection: Upgrade, HTTP2-Settings\r\n\r\n"),
        ("pipelined, the second with a body", f"GET /a HTTP/1.1\r\n{h}\r\nPOST /b HTTP/1.1\r\n{h}Content-Length: 5\r\n\r\nhello"),
    ]


def mutations():
    """Framing fields spelled the ways parsers are known to part on."""
    s = smuggled()
    chunk = chunk_of(s)
    h = f"Host: {HOST}\r\n"
    cases = []
    for coding in ["chunked ", " chunked", "\tchunked", "Chunked", "chunked,", ",chunked", "chunked;q=1",
                   '"chunked"', "chunk", "chunked\x00", "chunked\r", "identity , chunked", "x, chunked",
                   "chunked\x85", "\x85chunked"]:
        cases.append((f"Transfer-Encoding: {coding!r} beside Content-Length: 4",
                      f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: {coding}\r\nContent-Length: 4\r\n\r\n{chunk}"))
    for length in [" 5", "5 ", "05", "5,5", "5, 6", "5\t", "1e1", "5.0", "\x0b5", "٥", "00000000000000000005"]:
        cases.append((f"Content-Length: {length!r}",
                      f"POST / HTTP/1.1\r\n{h}Content-Length: {length}\r\n\r\nhello{s}"))
    for size in ["05", "5 ", "5;x", '5;x="a;b"', "5\t", "0000000000000005", "5;\x00", "5;\r", "5 ;x",
                 "5;x\rx", "5\x00", "+5", "5_"]:
        cases.append((f"chunk size {size!r}",
                      f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n{size}\r\nhello\r\n0\r\n\r\n{s}"))
    for name in ["Transfer-encoding", "TRANSFER-ENCODING", "Transfer_Encoding", "Transfer-Encoding\x00",
                 " Transfer-Encoding", "\x85Transfer-Encoding"]:
        cases.append((f"header name {name!r}",
                      f"POST / HTTP/1.1\r\n{h}{name}: chunked\r\nContent-Length: 4\r\n\r\n{chunk}"))
    for end in ["\r\n", "\n", "\r"]:
        cases.append((f"last chunk ended by {end!r}",
                      f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0{end}\r\n{s}"))
        cases.append((f"chunk data ended by {end!r}",
                      f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5\r\nhello{end}0\r\n\r\n{s}"))
    cases.append(("trailer that looks like a request",
                  f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n0\r\nX: y\r\n\r\n{s}"))
    cases.append(("trailer with a bare LF",
                  f"POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n0\r\nX: y\n\r\n{s}"))
    cases.append(("Expect 100-continue with a body",
                  f"POST / HTTP/1.1\r\n{h}Expect: 100-continue\r\nContent-Length: 5\r\n\r\nhello"))
    cases.append(("HTTP/1.0 keep-alive with a body",
                  f"POST / HTTP/1.0\r\n{h}Connection: keep-alive\r\nContent-Length: 5\r\n\r\nhello"))
    return cases


def corpus(quick):
    # Latin-1 keeps each code point below 256 one byte; the rest (a non-ASCII digit) goes
    # as UTF-8, as a client would send it.
    cases = [(name, raw.encode("latin-1") if max(map(ord, raw)) < 256 else raw.encode())
             for name, raw in base_cases() + mutations()]
    return cases[:12] if quick else cases


# ------------------------------------------------------------------ the origins

def start_go(work):
    port = free_port()
    binary = work / "garden-go-origin"
    if not binary.exists():
        subprocess.run(["go", "build", "-o", str(binary), str(GARDEN / "origin.go")], check=True,
                       env={**os.environ, "GO111MODULE": "off"}, capture_output=True)
    return Process("origin-go", [str(binary), f"127.0.0.1:{port}"], work), port


def start_node(work):
    port = free_port()
    return Process("origin-node", ["node", str(GARDEN / "origin.js"), str(port)], work), port


def start_gunicorn(work):
    port = free_port()
    gunicorn = VENV / "bin" / "gunicorn"
    if not gunicorn.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "gunicorn==23.0.0"], check=True)
    return Process("origin-gunicorn", [str(gunicorn), "--bind", f"127.0.0.1:{port}", "--workers", "1",
                                       "--worker-class", "gthread", "--threads", "4", "--keep-alive", "60",
                                       "--chdir", str(GARDEN), "--error-logfile", "/dev/null",
                                       "origin_wsgi:app"], work), port


def start_nginx(work):
    port = free_port()
    conf = work / "origin-nginx.conf"
    log = work / "origin-nginx.log"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {work}/origin-nginx.pid;
error_log {work}/origin-nginx-error.log;
events {{ worker_connections 1024; }}
http {{
    log_format line '$request_method $request_uri -';
    map $status $answered {{ 200 1; default 0; }}
    access_log {log} line if=$answered;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        location / {{ default_type text/plain; return 200 "$request_method $request_uri -\\n"; }}
    }}
}}
""")
    proc = Process("origin-nginx-main", ["nginx", "-c", str(conf), "-p", str(work)], work)
    proc.lines_file = log
    return proc, port


def start_haproxy(work):
    port = free_port()
    conf = work / "origin-haproxy.cfg"
    conf.write_text(f"""global
    log stdout format raw local0
defaults
    mode http
    log global
    option http-buffer-request
    timeout connect 3s
    timeout client 60s
    timeout server 60s
    timeout http-request 5s
frontend origin
    bind 127.0.0.1:{port}
    log-format "%HM %HU %[var(txn.body_len)]"
    http-request set-var(txn.body_len) req.body_len
    http-request return status 200 content-type text/plain lf-string "%[method] %[url] %[req.body_len]\\n"
""")
    return Process("origin-haproxy", ["haproxy", "-db", "-f", str(conf)], work), port


ORIGINS = {"go": start_go, "node": start_node, "gunicorn": start_gunicorn, "nginx": start_nginx,
           "haproxy": start_haproxy}


def origin_lines(proc, work):
    path = getattr(proc, "lines_file", None) or work / f"{proc.name}.log"
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return []
    return [line + b"\n" for line in text.split(b"\n") if ORIGIN_LINE.match(line + b"\n")]


# ------------------------------------------------------------------ the fronts

def start_h1_floor(work, origin_port):
    port = free_port()
    binary = ROOT / "target" / "release" / "h1-floor"
    proc = Process(f"front-h1-floor-{port}", [str(binary), "--listen", f"127.0.0.1:{port}", "--threads", "1",
                                              "--route", f"{HOST}=127.0.0.1:{origin_port}"], work)
    wait_port(port)
    return proc, port


def start_switchyard(work, origin_port):
    # Short names: Switchyard's data directory holds a Unix socket (108 bytes at most).
    proc, port, admin = bench.serve_switchyard(work, f"sy{free_port()}", "--threads", "1", "--waf", "off")
    put_app(admin, "garden", {"domains": [HOST], "backends": [f"127.0.0.1:{origin_port}"]})
    return proc, port


def start_naive(work, origin_port):
    port = free_port()
    proc = Process(f"front-naive-{port}", [sys.executable, str(GARDEN / "naive_front.py"), str(port),
                                           str(origin_port)], work)
    wait_port(port)
    return proc, port


CONTROL = "naive-control"
FRONTS = {"h1-floor": start_h1_floor, "switchyard": start_switchyard,
          # The control: smuggles on purpose (Content-Length only, one kept backend
          # connection); the garden must find it out.
          CONTROL: start_naive}


# ------------------------------------------------------------------ one case

def read_answers(sock, quiet_s=0.4, most_s=3.0):
    data = b""
    sock.settimeout(quiet_s)
    deadline = time.time() + most_s
    while time.time() < deadline:
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    return data


def split_answers(data):
    """(status, body) of each answer in `data`, in order (Content-Length or chunked bodies)."""
    answers = []
    while data:
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            break
        head, data = data[:head_end], data[head_end + 4:]
        lines = head.split(b"\r\n")
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            break
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            continue
        if b"content-length" in fields:
            n = int(fields[b"content-length"])
            body, data = data[:n], data[n:]
        elif fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while True:
                size_end = data.find(b"\r\n")
                if size_end < 0:
                    data = b""
                    break
                size = int(data[:size_end].split(b";")[0], 16)
                body += data[size_end + 2:size_end + 2 + size]
                data = data[size_end + 4 + size:]
                if size == 0:
                    break
        else:
            body, data = data, b""
        answers.append((status, body))
    return answers


def run_case(port, origin, work, raw):
    before = len(origin_lines(origin, work))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(raw)
        except OSError:
            pass
        answers = split_answers(read_answers(sock))
    time.sleep(0.15)
    read_by_origin = origin_lines(origin, work)[before:]
    forwarded = [body for _, body in answers if ORIGIN_LINE.match(body)]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET /victim HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        victim = split_answers(read_answers(sock, quiet_s=1.0))
    time.sleep(0.1)
    victim_read = origin_lines(origin, work)[before + len(read_by_origin):]
    problems = []
    unanswered = list(read_by_origin)
    for line in forwarded:
        if line in unanswered:
            unanswered.remove(line)
        else:
            problems.append(f"client got {line.decode('latin-1').strip()!r}, which the origin never read")
    # A request the origin began to read and the front then cut short (its body found bad
    # after the head went on) is answered by the front, or the connection closed: allowed,
    # as long as it is the client's own request (no more of them than answers, or the one
    # a silent close left unanswered) and not the smuggled one.
    aborted = [line for line in unanswered
               if b" /smuggled " not in line and len(read_by_origin) <= max(len(answers), 1)]
    if len(aborted) < len(unanswered):
        problems.append(f"origin read {[l.decode('latin-1').strip() for l in read_by_origin]}, "
                        f"client got {[l.decode('latin-1').strip() for l in forwarded]}")
    victim_ok = (len(victim) == 1 and victim[0][0] == 200 and victim[0][1].startswith(b"GET /victim ")
                 and [l.split(b" ")[1] for l in victim_read] == [b"/victim"])
    if not victim_ok:
        problems.append(f"victim answered {victim!r}, origin read {victim_read!r}")
    statuses = [status for status, _ in answers]
    outcome = ("forwarded" if forwarded else
               f"refused {statuses[0]}" if statuses else "closed")
    return outcome, problems, len(aborted)


def garden(front_name, origin_name, cases, work):
    rows = []
    with bench.Started() as procs:
        origin, origin_port = ORIGINS[origin_name](work)
        procs.append(origin)
        wait_port(origin_port)
        front, port = FRONTS[front_name](work, origin_port)
        procs.append(front)
        for name, raw in cases:
            outcome, problems, aborted = run_case(port, origin, work, raw)
            rows.append({"case": name, "outcome": outcome, "problems": problems, "aborted": aborted})
    return rows


# ------------------------------------------------------------------ report

def write_report(results, when, commit):
    fronts = sorted({f for f, _ in results})
    origins = sorted({o for _, o in results})
    lines = [TITLE, "",
             f"Run by `bench/conformance/garden.py` on {when}, {report.machine()}, commit {commit}: "
             f"{len(next(iter(results.values())))} cases (tests/smuggling.rs's HTTP/1 corpus and "
             "mutations of its framing fields), each on a fresh client connection through a front "
             "holding one pooled connection to the origin; then a victim request. A case agrees "
             "when the origin read exactly the requests whose answers the client got through the "
             "front, and the victim got its own answer.", "",
             "| front | origin | cases | forwarded | refused or closed | of which the origin began to read (body cut short by the front) | disagreements |",
             "|---|---|---|---|---|---|---|"]
    for (front, origin), rows in results.items():
        forwarded = sum(r["outcome"] == "forwarded" for r in rows)
        bad = [r for r in rows if r["problems"]]
        aborted = sum(r["aborted"] > 0 for r in rows)
        lines.append(f"| {front} | {origin} | {len(rows)} | {forwarded} | {len(rows) - forwarded} | "
                     f"{aborted} | {len(bad)} |")
    disagreements = [(f, o, r) for (f, o), rows in results.items() for r in rows
                     if r["problems"] and f != CONTROL]
    lines += ["", "Disagreements of the fronts under test:" if disagreements
              else "No disagreement through the fronts under test."]
    lines += [""] if disagreements else []
    for front, origin, row in disagreements:
        lines.append(f"- {front} → {origin}, {row['case']!r} ({row['outcome']}): {'; '.join(row['problems'])}")
    control = [(o, r) for (f, o), rows in results.items() for r in rows if r["problems"] and f == CONTROL]
    if any(f == CONTROL for f, _ in results):
        lines += ["", f"The control ({CONTROL}: Content-Length only, one kept backend connection) "
                  f"disagreed in {len(control)} case runs, as it must for the garden to mean "
                  "anything; the first of them:", ""]
        lines += [f"- → {o}, {r['case']!r} ({r['outcome']}): {'; '.join(r['problems'])}" for o, r in control[:3]]
    lines += ["", f"Fronts: {', '.join(fronts)}. Origins: {', '.join(origins)} "
              "(Go's net/http, Node's http/llhttp, gunicorn, nginx, HAProxy)."]
    report.replace_section(TITLE, lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--front", action="append", choices=sorted(FRONTS))
    parser.add_argument("--origin", action="append", choices=sorted(ORIGINS))
    parser.add_argument("--quick", action="store_true", help="the first 12 cases (smoke test)")
    args = parser.parse_args()
    cases = corpus(args.quick)
    work = Path(tempfile.mkdtemp(prefix="garden-"))
    fronts = args.front or ["h1-floor", "switchyard", CONTROL]
    origins = args.origin or sorted(ORIGINS)
    missing = [tool for tool, needed in (("go", "go" in origins), ("node", "node" in origins),
                                          ("nginx", "nginx" in origins), ("haproxy", "haproxy" in origins))
               if needed and not shutil.which(tool)]
    if missing:
        sys.exit(f"missing: {', '.join(missing)} (bench/run and bench/conformance/run install them)")
    results = {}
    # One worker per origin: the cases wait on quiet sockets far more than they compute.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(origins)) as pool:
        for front in fronts:
            for origin in origins:
                (work / f"{front[:2]}-{origin}").mkdir()
            futures = {origin: pool.submit(garden, front, origin, cases, work / f"{front[:2]}-{origin}")
                       for origin in origins}
            for origin, future in futures.items():
                results[(front, origin)] = future.result()
                rows = results[(front, origin)]
                bad = [r for r in rows if r["problems"]]
                print(f"{front} → {origin}: {len(rows)} cases, "
                      f"{sum(r['outcome'] == 'forwarded' for r in rows)} forwarded, "
                      f"{sum(r['aborted'] > 0 for r in rows)} cut short, {len(bad)} disagreements",
                      flush=True)
                for row in bad[:5] if front == CONTROL else bad:
                    print(f"  {row['case']!r} ({row['outcome']}): {'; '.join(row['problems'])}", flush=True)
    if not args.quick:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        write_report(results, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit)
    under_test = [r for (front, _), rows in results.items() if front != CONTROL for r in rows]
    control = [r for (front, _), rows in results.items() if front == CONTROL for r in rows]
    if control and not any(r["problems"] for r in control):
        print(f"the control ({CONTROL}) agreed everywhere: the garden found nothing it could find",
              file=sys.stderr)
        return 1
    return 1 if any(r["problems"] for r in under_test) else 0


if __name__ == "__main__":
    sys.exit(main())
