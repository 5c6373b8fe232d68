#!/usr/bin/env python3
"""The compression level sweep behind the router's levels (gzip 5, brotli 4, zstd 3): each
of its three encoders at every level on bench/compress.py's 64 KiB page, and nginx's gzip
at levels 1 to 9 on the same page, in one run on one machine.

    python3 bench/compress_levels.py [--piece 16384]

Ours: bench/compress_levels (the router's crates, versions and windows) streams the page
in `piece`-byte pieces flushed one by one, as the router's compress stage does, and reports
its thread's CPU per KiB of page and the ratio (compressed ÷ original bytes). nginx's
ratio is that of its real answer (nginx started with `gzip_comp_level` N, the page asked
for with `Accept-Encoding: gzip`); its encoder's CPU per KiB is zlib's — the library its
gzip filter calls — at that level with nginx's window and memory level, timed the same way
(Python's zlib binding, the system libz). Writes the "Compression levels" section of
bench/RESULTS.md, earlier runs kept below.
"""

import argparse
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
import cache_hits  # noqa: E402
import compress  # noqa: E402

TITLE = "## Compression levels (bench/compress_levels.py)"
SWEEP = bench.ROOT / "bench" / "compress_levels"
CHOSEN = {"gzip": 5, "br": 4, "zstd": 3}
MIN_CPU_SECONDS = 0.25


def our_encoders(page_file, piece):
    subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path",
                    str(SWEEP / "Cargo.toml")], check=True)
    out = subprocess.run([str(SWEEP / "target" / "release" / "compress-levels"), str(page_file),
                          str(piece)], check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        coding, level, cpu, ratio = line.split()
        rows[(coding, int(level))] = (float(cpu), float(ratio))
    return rows


def zlib_cpu_per_kib(page, level, piece):
    """nginx's gzip filter: deflateInit2 with a gzip wrapper, its default 32 KiB window
    (gzip_window) and memory level 8 (gzip_hash), a sync flush per buffer."""
    def once():
        encoder = zlib.compressobj(level, zlib.DEFLATED, 31, 8)
        for start in range(0, len(page), piece):
            encoder.compress(page[start:start + piece])
            encoder.flush(zlib.Z_SYNC_FLUSH)
        encoder.flush()
    started, runs = time.thread_time(), 0
    while time.thread_time() - started < MIN_CPU_SECONDS:
        once()
        runs += 1
    return (time.thread_time() - started) / runs / (len(page) / 1024) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--piece", type=int, default=16 * 1024)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compress-levels-"))
    page = compress.html_page()
    page_file = work / "page.html"
    page_file.write_bytes(page)
    nginx_ratio = {}
    with bench.Started() as procs:
        origin, origin_port = bench.start_answer_origin(work, "origin", page, ["Content-Type: text/html"])
        procs.append(origin)
        for level in range(1, 10):
            nginx, port = compress.start_nginx(work, origin_port, level)
            nginx_ratio[level] = compress.answer_size(port, "gzip") / len(page)
            nginx.stop()
    bench.wait_for_quiet()
    ours = our_encoders(page_file, args.piece)
    lines = [
        TITLE,
        "",
        f"{bench.measured_on(nginx=True)}; Switchyard at "
        f"{cache_hits.commit()}. The {len(page) // 1024} KiB page of bench/compress.py streamed in "
        f"{args.piece // 1024} KiB pieces, each flushed; CPU per KiB of page is one thread's, repeated for at "
        f"least {MIN_CPU_SECONDS} s. The router's levels are marked ◀.",
        "",
        "| level | gzip µs/KiB | gzip ratio | nginx gzip ratio | nginx's zlib µs/KiB | br µs/KiB | br ratio | zstd µs/KiB | zstd ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for level in range(0, 20):
        cells = [str(level)]
        for coding in ("gzip",):
            row = ours.get((coding, level))
            mark = " ◀" if CHOSEN[coding] == level else ""
            cells += [f"{row[0]:.2f}{mark}", f"{row[1]:.3f}"] if row else ["", ""]
        if level in nginx_ratio:
            cells += [f"{nginx_ratio[level]:.3f}", f"{zlib_cpu_per_kib(page, level, args.piece):.2f}"]
        else:
            cells += ["", ""]
        for coding in ("br", "zstd"):
            row = ours.get((coding, level))
            mark = " ◀" if CHOSEN[coding] == level else ""
            cells += [f"{row[0]:.2f}{mark}", f"{row[1]:.3f}"] if row else ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    cache_hits.publish(TITLE, lines)


if __name__ == "__main__":
    main()
