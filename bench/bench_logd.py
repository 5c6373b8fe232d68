#!/usr/bin/env python3
"""Log service: seed 000's experiment against `switchyard logd` on this machine.

A sender speaking the router's batch protocol (crates/logs/src/frame.rs) sends 64 KiB
packets of access-log lines (250-byte lines, 50 apps, each packet holding lines of 8 of
them) at 100, 250, 500, 1,000, 2,500 and 5,000 packets/s for a bounded time, open loop: a
packet is due at k/rate whatever happened before, and may be sent only while fewer than
256 are unacknowledged (a router's window and memory are bounded too). logd runs as
shipped: `--fsync always` (each group of batches synced before its acks), rotation every
20 s (`--rotate-interval-s 20`), on the same disk as the raw-speed measurement.

Reported per rate: packets due and acknowledged by the end of the run, the backlog then
(lines due but not yet acknowledged, the article's "remaining lines"), the sustained MB/s
acknowledged, how long the backlog took to drain, and the lines found in the files at the
end (they must equal the lines sent). The disk's raw sequential write speed is measured in
the same run with `dd bs=1M count=1024 conv=fsync` into the same directory.
Results go to bench/results/latest.json under "logd" and to bench/RESULTS.md.
"""

import random
import re
import socket
import struct
import subprocess
import threading
import time
import zlib

import bench as common
import report

RATES = [100, 250, 500, 1000, 2500, 5000]
PACKET_BYTES = 64 * 1024
LINE_BYTES = 250
APPS = 50
APPS_PER_PACKET = 8
WINDOW = 256
ROTATE_S = 20


def make_payloads(count):
    """`count` distinct payloads (cycled through), each ≤ 64 KiB of lines of 8 apps."""
    payloads = []
    for p in range(count):
        apps = [f"app{(p * APPS_PER_PACKET + i) % APPS}" for i in range(APPS_PER_PACKET)]
        blocks, size, lines = {a: [] for a in apps}, 0, 0
        while True:
            app = apps[lines % len(apps)]
            line = (f'{{"time":"2026-11-23T00:00:00.000Z","app":"{app}","n":{lines},"path":"/'
                    + "x" * LINE_BYTES)[: LINE_BYTES - 2] + '"}'
            added = len(line) + 1 + (0 if blocks[app] else 1 + len(app) + 4)
            if size + added > PACKET_BYTES:
                break
            blocks[app].append(line)
            size += added
            lines += 1
        payload = b"".join(
            bytes([len(a)]) + a.encode() + struct.pack(">I", len(body)) + body
            for a, ls in blocks.items() if ls
            for body in [("\n".join(ls) + "\n").encode()]
        )
        payloads.append((payload, zlib.crc32(payload), lines))
    return payloads


class Sender:
    """One connection, open-loop schedule, window-bounded, acks read on a thread."""

    def __init__(self, port, payloads):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.payloads = payloads
        self.sender_id = random.getrandbits(63)
        self.sent = 0
        self.acked = 0
        self.acked_lines = 0
        self.acked_bytes = 0
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self.read_acks, daemon=True)
        self.reader.start()

    def read_acks(self):
        pending = b""
        while True:
            data = self.sock.recv(65536)
            if not data:
                return
            pending += data
            while len(pending) >= 21:
                ack, pending = pending[:21], pending[21:]
                if ack[:4] != b"SYLA" or ack[20] != 0:
                    raise RuntimeError(f"bad ack {ack!r}")
                seq = struct.unpack(">Q", ack[12:20])[0]
                payload, _, lines = self.payloads[(seq - 1) % len(self.payloads)]
                with self.cond:
                    self.acked += 1
                    self.acked_lines += lines
                    self.acked_bytes += len(payload)
                    self.cond.notify_all()

    def send_next(self):
        with self.cond:
            while self.sent - self.acked >= WINDOW:
                self.cond.wait()
        seq = self.sent + 1
        payload, crc, _ = self.payloads[self.sent % len(self.payloads)]
        header = b"SYLB" + struct.pack(">QQII", self.sender_id, seq, len(payload), crc)
        self.sock.sendall(header + payload)
        self.sent += 1

    def run(self, rate, seconds):
        start = time.monotonic()
        due_total = rate * seconds
        while True:
            now = time.monotonic() - start
            if now >= seconds:
                break
            # Packet k is due at k / rate.
            due = min(due_total, int(now * rate) + 1)
            if self.sent < due:
                self.send_next()
            elif self.sent < due_total:
                time.sleep(max(0.0, self.sent / rate - now))
            else:
                time.sleep(max(0.0, seconds - now))
        # Packets written in the last moment are still in flight; a service that keeps up
        # acknowledges them within this grace, one that does not is measured by its backlog.
        with self.cond:
            self.cond.wait_for(lambda: self.acked >= self.sent, timeout=1.0)
            at_end = (self.acked, self.acked_lines, self.acked_bytes)
        return due_total, at_end

    def drain(self, due_total, deadline_s):
        start = time.monotonic()
        while self.sent < due_total and time.monotonic() - start < deadline_s:
            self.send_next()
        with self.cond:
            self.cond.wait_for(lambda: self.acked >= self.sent,
                               timeout=max(0.1, deadline_s - (time.monotonic() - start)))
        return time.monotonic() - start


def disk_write_mb_s(directory):
    target = directory / "dd-test"
    out = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=1024", "conv=fsync"],
                         capture_output=True, text=True).stderr
    target.unlink(missing_ok=True)
    seconds = float(re.search(r"copied, ([\d.]+) s", out).group(1))
    return 1024 * 1024 * 1024 / seconds / 1e6


def lines_in(directory):
    total = 0
    for path in directory.rglob("access.log*"):
        if path.suffix == ".gz":
            continue
        with open(path, "rb") as f:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return total


def measure(work, seconds, procs):
    run_seconds = max(seconds, 5) if seconds < 10 else 40
    disk = disk_write_mb_s(work)
    payloads = make_payloads(64)
    lines_per_packet = sum(l for _, _, l in payloads) / len(payloads)
    rows = []
    for rate in RATES:
        logs = work / f"logs-{rate}"
        port = common.free_port()
        logd = common.Process(f"logd-{rate}", [str(common.BIN), "logd", "--listen", f"127.0.0.1:{port}",
                                               "--dir", str(logs), "--rotate-interval-s", str(ROTATE_S),
                                               "--keep", "1000", "--fsync", "always"], work)
        procs.append(logd)
        common.wait_port(port)
        sender = Sender(port, payloads)
        due, (acked, acked_lines, acked_bytes) = sender.run(rate, run_seconds)
        due_lines = round(due * lines_per_packet)
        drain_s = sender.drain(due, deadline_s=120)
        time.sleep(0.2)
        logd.stop()
        procs.remove(logd)
        sent_lines = sum(payloads[i % len(payloads)][2] for i in range(sender.sent))
        row = {
            "rate": rate, "seconds": run_seconds, "due": due, "acked": acked,
            "backlog_lines": max(0, due_lines - acked_lines),
            "mb_s": acked_bytes / run_seconds / 1e6,
            "offered_mb_s": due * PACKET_BYTES / run_seconds / 1e6,
            "drain_s": drain_s if acked < due else 0.0,
            "lines_sent": sent_lines, "lines_in_files": lines_in(logs),
            "rotations": len(list(logs.rglob("access.log.*"))),
        }
        rows.append(row)
        print(f"logd {rate}/s: backlog {row['backlog_lines']} lines, {row['mb_s']:.1f} MB/s, "
              f"files {row['lines_in_files']}/{sent_lines}", flush=True)
        subprocess.run(["rm", "-rf", str(logs)])
    return {"disk_mb_s": disk, "rows": rows, "lines_per_packet": lines_per_packet,
            "packet_bytes": PACKET_BYTES}


def main():
    return report.run_section("logd", __doc__, measure)


if __name__ == "__main__":
    raise SystemExit(main())
