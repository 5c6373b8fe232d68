#!/usr/bin/env python3
"""Image resizing on the worker pool, and seed 001's question for it: does a light route
stay fast while thumbnails saturate the pool?

Switchyard serves two apps from the same origin (an nginx): `light` (plain GETs) and
`gallery` with the `images` option. Its original is a 1200×800 JPEG (quality 82, 4:4:4, made by
libjpeg-turbo's cjpeg from generated pixels with gradients and texture).
The light route runs at a constant 500 req/s (vegeta, 1 s timeout), alone and while wrk
keeps 100, 200 and 400 connections asking for `/_img/320x240/photo.jpg` (each a fetch, a
decode, a resize and an encode on the pool of 2 threads). Thumbnails the pool cannot take in
time are answered 503 with Retry-After (wrk counts them as non-2xx). Four times: on the
worker pool as configured by default (SCHED_IDLE workers that give way to threads waiting for
a CPU), on SCHED_IDLE workers alone (`SWITCHYARD_BENCH_POOL=idle-kernel`, the default before),
on a pool of nice-10 workers (`nice`), and forced inline on the event loops (`inline`, what a
router without a pool does).

Thumbnails per second alone (64 connections) are measured for this build and, with
`SWITCHYARD_BASELINE_BIN=path/to/switchyard` (an earlier commit's release build, named by
`SWITCHYARD_BASELINE_COMMIT`), for that one in the same run. While 400 connections saturate the pool, a probe sends 200 thumbnail
requests one by one and times the 503 answers (target: refused in under 5 ms). The machine's
floor: the light route beside two `SCHED_IDLE` processes burning CPU and no heavy request.
CPU per thumbnail at a constant 50/s (vegeta; utime + stime of the router, and of its event
loops, ÷ thumbnails; three alternated runs with the baseline's build when it is given).

The decode floor: libjpeg-turbo's own tjbench decodes the same original at the scale the
router decodes it (3/8: 450×300, the smallest at least 320×240) on one core, in the same run;
the CPUs times that rate bounds any thumbnailer that decodes the original each time.

Results go to bench/results/latest.json under "images" and to bench/RESULTS.md.
"""

import os
import statistics
import subprocess
import sys
import threading
import time

import bench as common
import report
from bench_waf import LIGHT_HOST, LIGHT_RATE, honouring_retry_after, idle_neighbour_floor, isolation

GALLERY_HOST = "gallery.bench"
# The same gallery with a resize deadline the queue that 400 connections keep cannot meet:
# requests to it must be refused, which is what the refusal probe times. (Fresh requests to
# the 2 s gallery itself are served beside 400 connections that ask again at once: those
# connections' held requests have less of their deadline left, so they are the ones
# refused.)
HURRIED_HOST = "hurried.gallery.bench"
HURRIED_TIMEOUT_MS = 300
HEAVY_CONNECTIONS = [100, 200, 400]
THUMBNAIL = "/_img/320x240/photo.jpg"
WIDTH, HEIGHT = 1200, 800


def photo_pixels():
    """A 1200×800 RGB image with smooth gradients and texture, like a photo's detail (as PPM)."""
    rows = bytearray()
    for y in range(HEIGHT):
        for x in range(WIDTH):
            rows += bytes(((x * 255 // WIDTH) ^ (y & 15), (y * 255 // HEIGHT) ^ (x & 7), (x * y) % 251))
    return b"P6\n%d %d\n255\n" % (WIDTH, HEIGHT) + bytes(rows)


def start_origin(work):
    port = common.free_port()
    site = work / "site"
    site.mkdir()
    (site / "photo.jpg").write_bytes(jpeg_original(work))
    # nginx's workers run as another user: they must be able to reach the file.
    for path in (work, site, site / "photo.jpg"):
        path.chmod(0o755)
    proc = common.start_nginx_origin(work, "origin", f"""
    server {{
        listen 127.0.0.1:{port};
        root {site};
        location = / {{ return 200 "ok\\n"; }}
    }}""", [port])
    return proc, port, site


def jpeg_original(work):
    """The original, made by libjpeg-turbo's cjpeg, not by the router under test, so every
    build is measured on the same bytes: quality 82 without chroma subsampling, the JPEG the
    image crate's encoder made for the runs before 2026-11-26 (586 KB then, 591 KB now)."""
    pixels = work / "photo.ppm"
    pixels.write_bytes(photo_pixels())
    out = subprocess.run(["cjpeg", "-quality", "82", "-sample", "1x1", str(pixels)],
                         check=True, capture_output=True).stdout
    if not out.startswith(b"\xff\xd8"):
        raise SystemExit("cjpeg (libjpeg-turbo-progs) made no JPEG")
    return out


def decode_floor(site, seconds):
    """Frames per second tjbench decodes the original at 3/8 scale on one core, and the
    thumbnails per second the machine's CPUs could make if decoding were all they did."""
    out = subprocess.run(["tjbench", str(site / "photo.jpg"), "-scale", "3/8", "-benchtime", str(max(2, seconds // 3)),
                          "-warmup", "1"], check=True, capture_output=True, text=True).stdout
    fps = next(float(l.split()[-2]) for l in out.splitlines() if "Frame rate" in l)
    cpus = os.cpu_count() or 1
    print(f"decode floor: tjbench {fps:.0f} decodes/s per core, {cpus} CPUs", flush=True)
    return {"tjbench_fps_per_core": fps, "cpus": cpus, "ceiling_per_s": fps * cpus}


def start_switchyard(work, origin_port, pool_mode="threads", pool_sched=None, binary=None, tag=""):
    proc, http_port, admin_port = common.serve_switchyard(
        work, f"switchyard-images-{pool_mode}{tag}", "--threads", str(common.THREADS),
        "--pool-threads", str(common.THREADS), "--waf", "off",
        log_level="error", binary=binary, env=common.benchmark_pool(pool_mode, pool_sched))
    for name, host, extra in [("gallery", GALLERY_HOST, {"images": {"timeout_ms": 2000}}),
                              ("hurried", HURRIED_HOST, {"images": {"timeout_ms": HURRIED_TIMEOUT_MS}}),
                              ("light", LIGHT_HOST, {})]:
        common.put_app(admin_port, name, {"domains": [host], "backends": [f"127.0.0.1:{origin_port}"], **extra})
    return proc, http_port


def thumbnail_script(work):
    script = work / "thumbnail.lua"
    script.write_text(f'wrk.headers["Host"] = "{GALLERY_HOST}"\n')
    return script


def thumbnails_per_s(row, out):
    """Thumbnails actually made per second in a wrk run: answers less 503 refusals."""
    return {"thumbnails_per_s": common.answered_2xx_per_s(out)}


def thumbnails_alone(port, script, seconds):
    """Thumbnails made per second with 64 connections (answers less 503 refusals): (rate,
    wrk's errors)."""
    out = subprocess.run(["wrk", "-t2", "-c64", f"-d{seconds}s", "-s", str(script), "--timeout", "5s",
                          f"http://127.0.0.1:{port}{THUMBNAIL}"], check=True, capture_output=True,
                         text=True).stdout
    _, errors = common.parse_wrk(out)
    return thumbnails_per_s({"heavy_errors": errors}, out)["thumbnails_per_s"], errors


# Thumbnails a second for the CPU measurement: under what either build makes alone (106–123/s
# for 0997a67's), so both make every one.
CPU_RATE = 50
CPU_ROUNDS = 3


def cpu_per_thumbnail(routers, seconds):
    """CPU per thumbnail at a constant CPU_RATE for each of `routers` (name, port, process),
    alternated CPU_ROUNDS times: the whole router and its event loops (threads named
    `hyper-listener…`), ms per thumbnail; medians and every run."""
    runs = common.cpu_per_request(
        routers, lambda port: f"GET http://127.0.0.1:{port}{THUMBNAIL}\nHost: {GALLERY_HOST}\n",
        CPU_RATE, seconds, CPU_ROUNDS, "thumbnails,", threads="hyper-listener")
    return {"rate": CPU_RATE, "routers": {
        name: {"cpu_ms": statistics.median(r["cpu_ms"] for r in measured),
               "loops_ms": statistics.median(r["threads_ms"] for r in measured),
               "cpu_ms_runs": [round(r["cpu_ms"], 2) for r in measured],
               "success": min(r["success"] for r in measured)}
        for name, measured in runs.items()}}


def refusal_times(port, script, seconds):
    """While wrk keeps 400 connections of thumbnails going, 200 requests one by one for the
    hurried gallery's thumbnail: how
    long the 503 answers took, in ms. The router says which 503 it is: refused before
    queueing ("the image workers are busy") or admitted and then out of time at the
    deadline ("could not be resized in time") — the target wants the first, fast, and never
    the second."""
    heavy = threading.Thread(target=subprocess.run, args=(
        ["wrk", "-t2", "-c400", f"-d{seconds}s", "-s", str(script), "--timeout", "5s",
         f"http://127.0.0.1:{port}{THUMBNAIL}"],), kwargs={"capture_output": True})
    heavy.start()
    time.sleep(min(2, seconds / 3))
    refused, timed_out, served = [], [], 0
    for _ in range(200):
        started = time.monotonic()
        status, body = common.get(port, HURRIED_HOST, THUMBNAIL)
        took = (time.monotonic() - started) * 1000
        if status == 503 and b"in time" in body:
            timed_out.append(took)
        elif status == 503:
            refused.append(took)
        elif status == 200:
            served += 1
    heavy.join()
    refused.sort()
    summary = {"probes": 200, "deadline_ms": HURRIED_TIMEOUT_MS, "served": served, "refused": len(refused),
               "timed_out": len(timed_out)}
    if timed_out:
        summary["timed_out_p50_ms"] = round(statistics.median(timed_out), 2)
    if refused:
        summary.update({"p50_ms": round(statistics.median(refused), 2),
                        "p99_ms": round(refused[min(len(refused) - 1, int(len(refused) * 0.99))], 2),
                        "max_ms": round(refused[-1], 2)})
    print(f"refusals under 400 connections: {summary}", flush=True)
    return summary


def measure(work, seconds, procs):
    earlier = common.earlier_summary("images", lambda s: {
        "alone_rps": round(s["alone_rps"], 1),
        "light_p99_ratios": [round(r["p99_ms"] / s["isolation"][0]["p99_ms"], 2) for r in s["isolation"][1:]]})
    origin, origin_port, site = start_origin(work)
    procs.append(origin)
    sy, port = start_switchyard(work, origin_port)
    procs.append(sy)
    original_bytes = (site / "photo.jpg").stat().st_size
    status, body = common.get(port, GALLERY_HOST, THUMBNAIL)
    if status != 200 or not body.startswith(b"\xff\xd8"):
        raise SystemExit(f"the thumbnail route answered {status}, not a JPEG")
    script = thumbnail_script(work)
    rps, errors = thumbnails_alone(port, script, seconds)
    results = {"seconds": seconds, "light_rate": LIGHT_RATE, "width": WIDTH, "height": HEIGHT,
               "thumbnail": THUMBNAIL, "original_bytes": original_bytes, "alone_rps": rps, "alone_errors": errors,
               "earlier_runs": earlier}
    print(f"thumbnails alone: {rps:.0f}/s {errors}", flush=True)
    results["decode_floor"] = decode_floor(site, seconds)
    baseline = os.environ.get("SWITCHYARD_BASELINE_BIN")
    if baseline:
        commit = os.environ.get("SWITCHYARD_BASELINE_COMMIT", "?")
        base, base_port = start_switchyard(work, origin_port, binary=baseline, tag="-baseline")
        procs.append(base)
        base_rps, base_errors = thumbnails_alone(base_port, script, seconds)
        results["baseline"] = {"commit": commit, "alone_rps": base_rps,
                               "alone_errors": base_errors}
        print(f"baseline {baseline}: {base_rps:.0f} thumbnails/s {base_errors}", flush=True)
        results["cpu_per_thumbnail"] = cpu_per_thumbnail([("this build", port, sy), (commit, base_port, base)],
                                                         seconds)
        base.stop()
    else:
        results["cpu_per_thumbnail"] = cpu_per_thumbnail([("this build", port, sy)], seconds)
    results["refusals"] = refusal_times(port, script, seconds)
    results["idle_neighbour"] = idle_neighbour_floor(port, seconds)
    results["isolation"] = isolation(port, script, THUMBNAIL, seconds, "pool", thumbnails_per_s)
    results["isolation_retry_after"] = isolation(port, honouring_retry_after(script), THUMBNAIL, seconds,
                                                 "pool, clients honour Retry-After", thumbnails_per_s)
    sy.stop()
    kernel, kernel_port = start_switchyard(work, origin_port, pool_sched="idle-kernel", tag="-ik")
    procs.append(kernel)
    results["alone_rps_idle_kernel"], _ = thumbnails_alone(kernel_port, script, seconds)
    print(f"SCHED_IDLE alone: {results['alone_rps_idle_kernel']:.0f} thumbnails/s", flush=True)
    results["isolation_idle_kernel"] = isolation(kernel_port, script, THUMBNAIL, seconds, "pool, SCHED_IDLE alone",
                                                 thumbnails_per_s)
    kernel.stop()
    nice, nice_port = start_switchyard(work, origin_port, pool_sched="nice", tag="-nice")
    procs.append(nice)
    results["isolation_nice"] = isolation(nice_port, script, THUMBNAIL, seconds, "pool, nice 10",
                                          thumbnails_per_s)
    nice.stop()
    inline, inline_port = start_switchyard(work, origin_port, "inline")
    procs.append(inline)
    results["isolation_inline"] = isolation(inline_port, script, THUMBNAIL, seconds, "inline",
                                            thumbnails_per_s)
    return results


if __name__ == "__main__":
    sys.exit(report.run_section("images", __doc__, measure))
