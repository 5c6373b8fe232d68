#!/usr/bin/env python3
"""10,000 concurrent WebSockets through one proxy, Switchyard beside nginx, in one run.

For each proxy: an echo backend (its own process, asyncio, RFC 6455 framing) behind one
app; a client process opens N WebSockets through the proxy (at most 200 handshakes at a
time), sends one message on each and checks the echo, holds them all open for HOLD_S
seconds, then checks every one again with a second message. Memory per connection is the
growth of the proxy's resident set (all its processes) from before the first handshake to
when all N are open and have echoed once, divided by N.

Each proxy holds two sockets per WebSocket, so the count is capped by the open-file hard
limit (raised to 65,536 when the process may; the soft limit is raised to the hard one for
itself and its children). Everything listens on 127.0.0.1 and is stopped by PID.
Results: the "WebSockets held" section of bench/CONFORMANCE.md and
bench/results/websockets.json.
"""

import argparse
import asyncio
import base64
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, Process, free_port, put_app, rss_kib, serve_switchyard, wait_port  # noqa: E402
from report import machine, replace_section  # noqa: E402

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC11B65"
OPEN_AT_ONCE = 200
HOLD_S = 10
FILE_LIMIT = 65536
# Descriptors a proxy needs besides its two per WebSocket: listeners, logs, store, pools.
SPARE_FILES = 256
SECTION = "## WebSockets held (bench/conformance/websockets.py)"


# ------------------------------------------------------------------ RFC 6455, both ends

async def read_frame(reader):
    first, second = await reader.readexactly(2)
    length = second & 0x7F
    if length == 126:
        length = int.from_bytes(await reader.readexactly(2), "big")
    elif length == 127:
        length = int.from_bytes(await reader.readexactly(8), "big")
    mask = await reader.readexactly(4) if second & 0x80 else None
    payload = await reader.readexactly(length)
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return first & 0x0F, payload


def frame(opcode, payload, masked):
    head = bytes([0x80 | opcode])
    n = len(payload)
    bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([bit | n])
    else:
        head += bytes([bit | 126]) + n.to_bytes(2, "big")
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def echo_connection(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        while True:
            opcode, payload = await read_frame(reader)
            if opcode == 0x8:
                writer.write(frame(0x8, b"", masked=False))
                break
            writer.write(frame(opcode, payload, masked=False))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, StopIteration):
        pass
    finally:
        writer.close()


async def serve_echo(port):
    server = await asyncio.start_server(echo_connection, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


async def open_socket(port, host, slots):
    async with slots:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16))
        writer.write(b"GET /ws HTTP/1.1\r\nHost: " + host.encode() + b"\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: "
                     + key + b"\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        if not head.startswith(b"HTTP/1.1 101"):
            writer.close()
            raise RuntimeError(head.split(b"\r\n")[0].decode(errors="replace"))
        return reader, writer


async def echo_round(sockets, tag):
    async def one(i, reader, writer):
        message = f"{tag} {i}".encode()
        writer.write(frame(0x1, message, masked=True))
        await writer.drain()
        opcode, payload = await asyncio.wait_for(read_frame(reader), 30)
        return opcode == 0x1 and payload == message
    results = await asyncio.gather(*(one(i, r, w) for i, (r, w) in enumerate(sockets)),
                                   return_exceptions=True)
    return sum(1 for r in results if r is True)


async def client(port, host, count, hold_s, report_path):
    """Runs in its own process; reports through a JSON file and waits for a line on stdin
    between phases so the parent can measure the proxy at the right moments."""
    slots = asyncio.Semaphore(OPEN_AT_ONCE)
    started = time.time()
    opened = await asyncio.gather(*(open_socket(port, host, slots) for _ in range(count)),
                                  return_exceptions=True)
    sockets = [s for s in opened if not isinstance(s, BaseException)]
    errors = sorted({str(e) or type(e).__name__ for e in opened if isinstance(e, BaseException)})
    open_s = time.time() - started
    first = await echo_round(sockets, "first")
    Path(report_path).write_text(json.dumps({"opened": len(sockets), "open_s": open_s,
                                             "first_echo": first, "errors": errors[:5]}))
    print("open", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await asyncio.sleep(hold_s)
    second = await echo_round(sockets, "second")
    for reader, writer in sockets:
        writer.write(frame(0x8, b"", masked=True))
        writer.close()
    report = json.loads(Path(report_path).read_text())
    report["second_echo"] = second
    Path(report_path).write_text(json.dumps(report))
    print("done", flush=True)


# ------------------------------------------------------------------ proxies

def start_switchyard(work, backend, domain="ws.test"):
    proc, http_port, admin = serve_switchyard(work, "switchyard", "--threads", "2")
    put_app(admin, "ws", {"domains": [domain], "backends": [f"127.0.0.1:{backend}"]})
    return proc, http_port


def start_nginx(work, backend, domain="ws.test"):
    port = free_port()
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes 2;
worker_rlimit_nofile {resource.getrlimit(resource.RLIMIT_NOFILE)[1]};
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections {FILE_LIMIT // 2}; }}
http {{
    access_log off;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        server_name {domain};
        location / {{
            proxy_pass http://127.0.0.1:{backend};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $host;
            proxy_read_timeout 3600s;
        }}
    }}
}}
""")
    proc = Process("nginx", ["nginx", "-c", str(conf), "-p", str(work)], work)
    wait_port(port)
    return proc, port


def resident_kib(pid):
    """The resident set of a process and its children (nginx's workers)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return rss_kib(pid) + sum(rss_kib(int(c)) for c in children)


def measure(name, start, work, count, hold_s):
    backend_port = free_port()
    backend = Process(f"echo-{name}", [sys.executable, __file__, "--echo", str(backend_port)], work)
    wait_port(backend_port)
    proxy, port = start(work, backend_port)
    try:
        time.sleep(1)
        before = resident_kib(proxy.pid)
        report_path = work / f"client-{name}.json"
        client_proc = subprocess.Popen(
            [sys.executable, __file__, "--client", str(port), str(count), str(hold_s), str(report_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if client_proc.stdout.readline().strip() != "open":
            raise RuntimeError(f"{name}: the client failed while opening")
        time.sleep(1)
        held = resident_kib(proxy.pid)
        client_proc.stdin.write("go\n")
        client_proc.stdin.flush()
        client_proc.stdout.readline()
        client_proc.wait(timeout=600)
        report = json.loads(report_path.read_text())
        report.update({
            "asked": count,
            "hold_s": hold_s,
            "rss_before_kib": before,
            "rss_held_kib": held,
            "bytes_per_connection": (held - before) * 1024 / max(report["opened"], 1),
            "proxy_alive": proxy.proc.poll() is None,
        })
        return report
    finally:
        proxy.stop()
        backend.stop()


def nginx_version():
    out = subprocess.run(["nginx", "-v"], capture_output=True, text=True)
    return out.stderr.strip().split("/")[-1]


def write_section(results):
    s, n = results["switchyard"], results["nginx"]

    def row(label, key, fmt):
        return f"| {label} | {fmt(s[key])} | {fmt(n[key])} |"
    lines = [
        SECTION, "",
        f"Measured on {results['date']}, {results['machine']}. {s['asked']:,} WebSockets opened through "
        f"one proxy (at most {OPEN_AT_ONCE} handshakes at a time) to an echo backend, one message "
        f"each, held {s['hold_s']} s, a second message each. Memory: growth of the proxy's resident "
        "set (all its processes) from before the first handshake to all open, per connection.",
        *(["", f"Asked for {results['asked']:,}; this machine's open-file hard limit is "
           f"{results['file_limit']:,} and cannot be raised here (no CAP_SYS_RESOURCE), and a proxy "
           f"holds two sockets per WebSocket, so {s['asked']:,} is the most one proxy process can hold."]
          if s["asked"] < results["asked"] else []), "",
        f"| | Switchyard | nginx {results['nginx_version']} |", "|---|---|---|",
        row("WebSockets open", "opened", lambda v: f"{v:,}"),
        row("time to open them all", "open_s", lambda v: f"{v:.1f} s"),
        row("first echo answered", "first_echo", lambda v: f"{v:,}"),
        row(f"second echo answered after {s['hold_s']} s", "second_echo", lambda v: f"{v:,}"),
        row("resident set before", "rss_before_kib", lambda v: f"{v / 1024:.1f} MiB"),
        row("resident set with all open", "rss_held_kib", lambda v: f"{v / 1024:.1f} MiB"),
        row("memory per WebSocket", "bytes_per_connection", lambda v: f"{v / 1024:.1f} KiB"),
        "",
        f"Switchyard/nginx memory per WebSocket: {s['bytes_per_connection'] / max(n['bytes_per_connection'], 1):.2f}×.",
    ]
    for name, r in (("Switchyard", s), ("nginx", n)):
        if r["errors"]:
            lines.append(f"- {name} handshake errors (first five kinds): {', '.join(r['errors'])}")
    replace_section(SECTION, lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=10_000,
                        help="capped by what the open-file hard limit allows")
    parser.add_argument("--hold-s", type=int, default=HOLD_S)
    parser.add_argument("--echo", type=int)
    parser.add_argument("--client", nargs=4)
    args = parser.parse_args()
    if args.echo:
        asyncio.run(serve_echo(args.echo))
        return
    if args.client:
        port, count, hold_s, report = args.client
        asyncio.run(client(int(port), "ws.test", int(count), int(hold_s), report))
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))
    except (ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    file_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    connections = min(args.connections, (file_limit - SPARE_FILES) // 2)
    if connections < args.connections:
        print(f"open-file hard limit {file_limit}: {connections} WebSockets (two sockets each in the proxy)")
    work = Path(tempfile.mkdtemp(prefix="switchyard-ws-"))
    try:
        results = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(),
            "nginx_version": nginx_version(),
            "file_limit": file_limit,
            "asked": args.connections,
            "switchyard": measure("switchyard", start_switchyard, work, connections, args.hold_s),
            "nginx": measure("nginx", start_nginx, work, connections, args.hold_s),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (ROOT / "bench" / "results" / "websockets.json").write_text(json.dumps(results, indent=2) + "\n")
    write_section(results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
