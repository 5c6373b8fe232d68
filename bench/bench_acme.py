#!/usr/bin/env python3
"""ACME: the cost of issuing certificates for many domains, and of starting with them.

Pebble 2.4 (Let's Encrypt's test CA, Debian `pebble`) with pebble-challtestsrv as its DNS
(every name → 127.0.0.1), validating HTTP-01 against the router, which runs on the embedded
store with `--acme-check-interval-s 5`:

- issuing: N apps (1,000; 50 with --quick) each with one opted-in domain, each its own
  registered domain (`appI.test`: the CA's limit of 50 per registered domain per week,
  kept by the router, would otherwise be what is measured), are PUT at once;
  measured: time from the first PUT until the first 1,000 and until every domain's
  certificate is stored (the router's `switchyard_acme_orders_total{result="issued"}`),
  orders Pebble issued, failed orders, the router's resident memory before and after
  (10,000 was tried: Debian's Pebble 2.4 stopped answering new orders after 9,476 on
  2026-11-25, so the run measures 1,000);
- start-up: the same data directory (N apps, N issued certificates, N ACME records) started
  again with and without ACME, time from exec to the admin API answering, median of 5;
- start-up at scale: `switchyard bench-seed --acme` stores 10,000 and 100,000 opted-in apps,
  each with a certificate from a throw-away CA recorded as issued by the router's ACME
  issuer (renewal due in 60 days: the steady state of a fleet); the router started on it
  with ACME on and off (the same flags as bench_https' start-up figure): time from exec to
  the first HTTPS answer for the last domain (a cold certificate), resident memory then,
  and with ACME on the issuer's first full round over every domain (time from exec until
  `switchyard_acme_domains{state="issued"}` counts them all, orders it made: none are due,
  so 0 is expected, the router's CPU until then); median of 3 starts;
- a random-SNI flood on that data, with and without ACME: 3,000 TLS handshakes (one
  connection each, from 4 client threads), each with a server name no app owns; the
  router's CPU (utime + stime) per handshake, median of 3 rounds. Nothing is ordered for
  such names: ACME must cost them nothing.

Results go to bench/results/latest.json under "acme" and to bench/RESULTS.md.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

import bench as common
import report


def start_pebble(work, http_port):
    """Pebble and its DNS on free ports, its HTTPS certificate self-signed for localhost;
    returns (processes, directory URL, CA file)."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(work / "pebble-key.pem"), "-out", str(work / "pebble-cert.pem"),
                    "-days", "30", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    dns, dns_management = common.free_port(), common.free_port()
    listen, management = common.free_port(), common.free_port()
    config = work / "pebble.json"
    config.write_text(json.dumps({"pebble": {
        "listenAddress": f"127.0.0.1:{listen}", "managementListenAddress": f"127.0.0.1:{management}",
        "certificate": str(work / "pebble-cert.pem"), "privateKey": str(work / "pebble-key.pem"),
        "httpPort": http_port, "tlsPort": common.free_port(), "ocspResponderURL": "",
        "externalAccountBindingRequired": False}}))
    dns_proc = common.Process("challtestsrv", [
        "pebble-challtestsrv", "-defaultIPv4", "127.0.0.1", "-defaultIPv6", "",
        "-dns01", f"127.0.0.1:{dns}", "-management", f"127.0.0.1:{dns_management}",
        "-http01", "", "-https01", "", "-tlsalpn01", ""], work)
    common.wait_port(dns_management)
    pebble = common.Process("pebble", ["pebble", "-config", str(config), "-dnsserver", f"127.0.0.1:{dns}"],
                            work, env={**os.environ, "PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0"})
    common.wait_port(listen)
    return [dns_proc, pebble], f"https://localhost:{listen}/dir", work / "pebble-cert.pem"


def router_args(work, http_port, admin_port, acme):
    return [str(common.BIN), "serve", "--http", f"127.0.0.1:{http_port}", "--https", "off",
            "--admin", f"127.0.0.1:{admin_port}", "--data-dir", str(work / "data"),
            "--access-log", "off", "--shutdown-grace-s", "0", "--waf", "off", *acme]


def admin_json(admin_port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}{path}", timeout=10) as response:
        return json.loads(response.read())


def issued_orders(admin_port):
    return common.metric(admin_port, 'switchyard_acme_orders_total{result="issued"}') or 0


def startup_ms(work, acme, runs=5):
    """Median time from exec to the admin API answering, on the issuing run's data."""
    samples = []
    for i in range(runs):
        http_port, admin_port = common.free_port(), common.free_port()
        started = time.monotonic()
        proc = common.Process(f"restart-{'acme' if acme else 'plain'}-{i}",
                              router_args(work, http_port, admin_port, acme), work)
        while True:
            try:
                admin_json(admin_port, "/healthz")
                break
            except OSError:
                if time.monotonic() - started > 30:
                    raise RuntimeError("the router did not start")
                time.sleep(0.002)
        samples.append((time.monotonic() - started) * 1000)
        proc.stop()
    return sorted(samples)[len(samples) // 2]


def seeded_startup(work, procs, acme, sizes, runs=3):
    """Start-up over `bench-seed --acme` data of each size, ACME on and off."""
    import bench_https
    origin, backend, _ = common.start_origin(work)
    procs.append(origin)
    rows = []
    for size in sizes:
        data = work / f"seeded-{size}"
        subprocess.run([str(common.BIN), "bench-seed", "--data-dir", str(data), "--apps", str(size),
                        "--backend", f"127.0.0.1:{backend}", "--certs", str(size), "--acme"],
                       check=True, stdout=subprocess.DEVNULL)
        row = {"certificates": size}
        for label, flags in (("on", acme), ("off", [])):
            samples = []
            for i in range(runs):
                samples.append(one_seeded_start(work, data, size, flags, f"seeded-{size}-{label}-{i}",
                                                bench_https))
            samples.sort(key=lambda s: s["first_https_ms"])
            row[label] = samples[len(samples) // 2]
            print(f"{size} issued certificates stored, ACME {label}: {row[label]}", flush=True)
        rows.append(row)
    origin.stop()
    procs.remove(origin)
    return rows


def one_seeded_start(work, data, size, acme, tag, bench_https):
    http_port, https_port, admin_port = common.free_port(), common.free_port(), common.free_port()
    args = [str(common.BIN), "serve", "--http", f"127.0.0.1:{http_port}",
            "--https", f"127.0.0.1:{https_port}", "--admin", f"127.0.0.1:{admin_port}",
            "--data-dir", str(data), "--threads", str(common.THREADS), "--access-log", "off",
            "--shutdown-grace-s", "0", *acme]
    started = time.perf_counter()
    proc = common.Process(tag, args, work, env={"RUST_LOG": "warn", "PATH": "/usr/bin:/bin"})
    with common.Started([proc]):
        ready_s = bench_https.first_https_answer(https_port, f"app{size - 1}.bench", started)
        sample = {"first_https_ms": round(ready_s * 1000, 1), "rss_kib": common.rss_kib(proc.pid)}
        if acme:
            deadline = time.perf_counter() + 300
            while (common.metric(admin_port, 'switchyard_acme_domains{state="issued"}') or 0) < size:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"the issuer's first round did not count {size} issued domains")
                time.sleep(0.02)
            sample["first_round_done_ms"] = round((time.perf_counter() - started) * 1000, 1)
            sample["cpu_ms_until_round_done"] = round(common.cpu_seconds(proc.pid) * 1000, 1)
            sample["rss_after_round_kib"] = common.rss_kib(proc.pid)
            sample["orders"] = sum(common.metric(admin_port, f'switchyard_acme_orders_total{{result="{r}"}}') or 0
                                   for r in ("issued", "failed", "deferred"))
        else:
            sample["cpu_ms_at_first_answer"] = round(common.cpu_seconds(proc.pid) * 1000, 1)
    return sample


def sni_flood_us(work, acme, handshakes, rounds=3):
    """Router CPU µs per handshake for server names nobody owns, median of `rounds`."""
    import random
    import socket
    import ssl
    import threading
    http_port, admin_port, https_port = common.free_port(), common.free_port(), common.free_port()
    args = router_args(work, http_port, admin_port, acme)
    args[args.index("--https") + 1] = f"127.0.0.1:{https_port}"
    proc = common.Process(f"flood-{'acme' if acme else 'plain'}", args, work)
    common.wait_port(https_port)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE

    def shake(count):
        for _ in range(count):
            name = f"x{random.getrandbits(64):016x}.flood.test"
            try:
                with socket.create_connection(("127.0.0.1", https_port), timeout=5) as raw:
                    with context.wrap_socket(raw, server_hostname=name):
                        pass
            except (ssl.SSLError, OSError):
                pass  # no certificate for the name: the alert is the answer
    samples = []
    for _ in range(rounds):
        before = common.cpu_seconds(proc.pid)
        threads = [threading.Thread(target=shake, args=(handshakes // 4,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        samples.append((common.cpu_seconds(proc.pid) - before) * 1e6 / handshakes)
    proc.stop()
    return sorted(samples)[len(samples) // 2]


def measure(work, seconds, procs, quick):
    domains = 50 if quick else 1000
    first = min(domains, 1000)
    http_port, admin_port = common.free_port(), common.free_port()
    pebble_procs, directory, ca_file = start_pebble(work, http_port)
    procs.extend(pebble_procs)
    acme = ["--acme-directory", directory, "--acme-ca-file", str(ca_file),
            "--acme-email", "bench@example.test", "--acme-check-interval-s", "5",
            # Pebble has no order limit; the default (Let's Encrypt's 300 per 3 h) would
            # measure the limiter.
            "--acme-orders-per-3h", "100000"]
    router = common.Process("router", router_args(work, http_port, admin_port, acme), work)
    procs.append(router)
    common.wait_port(admin_port)
    rss_before = common.rss_kib(router.pid)
    started = time.monotonic()
    for i in range(domains):
        common.put_app(admin_port, f"app{i}", {"domains": [f"app{i}.test"],
                                               "backends": ["127.0.0.1:9"], "tls": {"acme": True}})
    put_s = time.monotonic() - started
    deadline = started + max(600, domains * 2)
    first_s = None
    while time.monotonic() < deadline:
        done = issued_orders(admin_port)
        if first_s is None and done >= first:
            first_s = time.monotonic() - started
        if done >= domains:
            break
        time.sleep(0.5)
    issuing_s = time.monotonic() - started
    issued = issued_orders(admin_port)
    failed = common.metric(admin_port, 'switchyard_acme_orders_total{result="failed"}') or 0
    rss_after = common.rss_kib(router.pid)
    pebble_issued = (work / "pebble.log").read_text().count("Issued certificate serial")
    router.stop()
    procs.remove(router)
    results = {
        "domains": domains, "put_s": round(put_s, 2), "issuing_s": round(issuing_s, 1),
        "first": first, "first_s": round(first_s, 1) if first_s else None,
        "issued": issued, "failed": failed, "pebble_issued": pebble_issued,
        "ms_per_certificate": round(issuing_s * 1000 / max(issued, 1), 1),
        "rss_before_kib": rss_before, "rss_after_kib": rss_after,
        "startup_ms_with_acme": round(startup_ms(work, acme), 1),
        "startup_ms_without_acme": round(startup_ms(work, []), 1),
        "sni_flood_us_with_acme": round(sni_flood_us(work, acme, 600 if quick else 3000), 1),
        "sni_flood_us_without_acme": round(sni_flood_us(work, [], 600 if quick else 3000), 1),
        "seeded_startup": seeded_startup(work, procs, acme, [1000] if quick else [10000, 100000]),
        "pebble": subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "pebble"],
                                 capture_output=True, text=True).stdout,
    }
    print(f"{issued:.0f}/{domains} certificates in {issuing_s:.1f} s ({results['ms_per_certificate']} ms each; "
          f"the first {first} in {results['first_s']} s), "
          f"{failed:.0f} failed, RSS {rss_before} → {rss_after} KiB; start-up with {domains} issued: "
          f"{results['startup_ms_with_acme']} ms with ACME, {results['startup_ms_without_acme']} ms without; "
          f"random-SNI handshake: {results['sni_flood_us_with_acme']} µs CPU with ACME, "
          f"{results['sni_flood_us_without_acme']} µs without", flush=True)
    return results


def main():
    quick = "--quick" in sys.argv
    return report.run_section("acme", __doc__, lambda work, seconds, procs: measure(work, seconds, procs, quick))


if __name__ == "__main__":
    sys.exit(main())
