#!/usr/bin/env python3
"""Slow readers and an app's workers: does a client that reads slowly hold the worker that
answered it? An app with four workers (as a Puma, Unicorn or gunicorn app has a few) sits
behind each front; eight clients ask it for a 32 MiB answer, read its first KiB and then
nothing for a while (a phone on a bad network), while a well-behaved client asks for a
small page every 300 ms. A front that reads answers ahead of its clients (nginx's
`proxy_buffering`, Switchyard's read-ahead) frees each worker once its answer is written;
one that does not leaves the app's workers writing into full sockets, and the small page
waits for them.

    python3 bench/conformance/slow_readers.py [--readers 8] [--hold 8]

Fronts: nginx (its defaults: proxy_buffering on), Switchyard, and Switchyard built from an
earlier commit when SWITCHYARD_BEFORE_BIN names it (SWITCHYARD_BEFORE_LABEL: its row's name). Everything listens on 127.0.0.1; every
process is stopped by its PID. Writes its section of bench/CONFORMANCE.md.
"""

import argparse
import concurrent.futures
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "engines"))
sys.path.insert(0, str(HERE))  # this folder's report.py before bench/'s
import bench  # noqa: E402
import report  # noqa: E402
import run as R  # noqa: E402

TITLE = "## Slow readers and the app's workers, issue 46 (bench/conformance/slow_readers.py)"
ANSWER_BYTES = 32 << 20
WORKERS = 4


class App(threading.Thread):
    """An app with WORKERS workers on keep-alive connections: `/big` is ANSWER_BYTES, any
    other path a short page. A worker is held from the request to the last byte written."""

    def __init__(self):
        super().__init__(daemon=True)
        self.server = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = self.server.getsockname()[1]
        self.workers = threading.Semaphore(WORKERS)
        self.big_done = []  # seconds each /big answer held its worker
        self.lock = threading.Lock()
        self.body = bytes(i % 251 for i in range(ANSWER_BYTES))

    def run(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        pending = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in pending:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    pending += data
                head, pending = pending.split(b"\r\n\r\n", 1)
                path = head.split(b" ", 2)[1]
                body = self.body if path == b"/big" else b"ok\n"
                with self.workers:
                    started = time.monotonic()
                    try:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                    except OSError:
                        return
                    if path == b"/big":
                        with self.lock:
                            self.big_done.append(time.monotonic() - started)


def slow_reader(port):
    """Asks for /big with a tiny receive window; reads nothing yet."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET /big HTTP/1.1\r\nHost: {R.HOST}\r\n\r\n".encode())
    return s


def first_kib(s, within):
    """Reads the answer's first KiB, then nothing more; False when none came in `within`
    seconds (every worker of the app was held)."""
    s.settimeout(within)
    got = b""
    try:
        while len(got) < 1024:
            data = s.recv(1024 - len(got))
            if not data:
                return False
            got += data
    except OSError:
        return False
    return True


def probe(port):
    """A small page on a new connection: seconds to the whole answer, None past 3 s."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(f"GET / HTTP/1.1\r\nHost: {R.HOST}\r\nConnection: close\r\n\r\n".encode())
            while s.recv(65536):
                pass
    except OSError:
        return None
    return time.monotonic() - started


def drain(s):
    s.settimeout(30)
    try:
        while s.recv(1 << 20):
            pass
    except OSError:
        pass
    s.close()


def measure(name, work, readers, hold):
    app = App()
    app.start()
    with bench.Started() as procs:
        proxy, port = R.PROXIES[name](work, app.port)
        procs.append(proxy)
        bench.get(port, R.HOST)
        started = time.monotonic()
        held = [slow_reader(port) for _ in range(readers)]
        with concurrent.futures.ThreadPoolExecutor(len(held)) as pool:
            begun = sum(pool.map(lambda s: first_kib(s, 2.0), held))
        probes = []
        while time.monotonic() - started < hold:
            probes.append(probe(port))
            time.sleep(0.3)
        with app.lock:
            written_whole = len(app.big_done)
            worker_seconds = list(app.big_done)
        for s in held:
            drain(s)
    app.server.close()
    answered = [p for p in probes if p is not None]
    return {
        "readers": readers,
        "answers_begun": begun,
        "answers_written_while_held": written_whole,
        "worker_ms_median": round(statistics.median(worker_seconds) * 1000, 1) if worker_seconds else None,
        "probes": len(probes),
        "probes_within_1s": sum(1 for p in answered if p < 1.0),
        "probe_p50_ms": round(statistics.median(answered) * 1000, 1) if answered else None,
        "probe_max_ms": round(max(answered) * 1000, 1) if answered else None,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--hold", type=float, default=8.0, help="seconds the readers read nothing")
    args = parser.parse_args()
    fronts = ["nginx", "switchyard"]
    if os.environ.get("SWITCHYARD_BEFORE_BIN"):
        fronts.append("switchyard-before")
    work = Path(tempfile.mkdtemp(prefix="slow-readers-"))
    results = {}
    for name in fronts:
        results[name] = measure(name, work, args.readers, args.hold)
        print(name, results[name], flush=True)
    commit = subprocess.run(["git", "-C", str(bench.ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    before = os.environ.get("SWITCHYARD_BEFORE_BIN", "")
    labels = {"nginx": "nginx (proxy_buffering on, its default)",
              "switchyard": f"Switchyard at {commit}",
              "switchyard-before": os.environ.get("SWITCHYARD_BEFORE_LABEL", f"Switchyard built at {before}")}
    lines = [
        TITLE,
        "",
        f"Run by `bench/conformance/slow_readers.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{report.machine()}. An app with {WORKERS} workers behind each front; {args.readers} clients "
        f"ask for a {ANSWER_BYTES >> 20} MiB answer, read 1 KiB and then nothing for {args.hold:g} s "
        "(a 4 KiB receive buffer), while a probe asks for a small page on a new connection every "
        "300 ms (given up after 3 s). *Answers begun*: those whose first KiB came within 2 s. "
        "*Answers written whole* counts the answers the app finished writing while "
        "their clients read nothing: each is a worker given back (an answer this size is more than the sockets between app and client hold).",
        "",
        "| front | answers begun | answers written whole while their clients read nothing | "
        "worker held per answer (median) | probes answered within 1 s | probe p50 / max |",
        "|---|---|---|---|---|---|",
    ]
    for name in fronts:
        r = results[name]
        worker = f"{r['worker_ms_median']} ms" if r["worker_ms_median"] is not None else "until the client reads"
        lines.append(f"| {labels[name]} | {r['answers_begun']} of {r['readers']} | "
                     f"{r['answers_written_while_held']} of {r['readers']} | {worker} | "
                     f"{r['probes_within_1s']} of {r['probes']} | "
                     + (f"{r['probe_p50_ms']} / {r['probe_max_ms']} ms |" if r["probe_p50_ms"] is not None
                        else "none answered |"))
    report.replace_section(TITLE, lines)


if __name__ == "__main__":
    main()
