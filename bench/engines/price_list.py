#!/usr/bin/env python3
"""The stages' price list: instructions per proxied request (callgrind) of one app per
stage, that stage alone switched on, beside the plain app and h1-floor in the same run; and
an app with every light switch on (limits, redirects, header rules, affinity, basic auth
with its verified password cached, compression off for small answers).

    python3 bench/engines/price_list.py [--requests 2000] [--rate 200] [--only NAME ...]

Each row is instructions.py's two-run measure (a few requests, then --requests more, the
difference over the difference): one Switchyard thread under valgrind, vegeta at a constant
rate over keep-alive, HTTP, to run.py's origin (nginx answering "ok\\n", 3 bytes). Every
request of a row is one the stage lets through to the app: a redirect that takes another
path, a password that checks, a rate above the load. Needs what bench/run installs
(valgrind, vegeta, python3-bcrypt). Writes nothing but its own output: copy the table to
bench/ENGINE.md.
"""

import argparse
import base64
import shutil
import sys
import tempfile
from pathlib import Path

import bcrypt

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run as R  # noqa: E402
import bench  # noqa: E402
import instructions as I  # noqa: E402

USER, PASSWORD = "bench", "a password for the bench"


def bcrypt_hash():
    """A bcrypt hash of PASSWORD at cost 5, as the tests and bench/switches.py make them."""
    return bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(5)).decode()


def rows(hash_):
    """(label, app options, request fields): the plain app, one stage each, all light."""
    auth = "Authorization: Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    limits = {"requests_per_s": 100000, "burst": 100000, "max_in_flight": 10000}
    redirects = [{"path_prefix": "/moved", "to": "/here", "status": 301}]
    headers = {"request": {"set": {"X-Team": "bench"}},
               "response": {"set": {"X-Frame-Options": "DENY"}}}
    affinity = {"cookie": "route"}
    basic_auth = {"realm": "bench", "users": {USER: hash_}}
    # From 1 KiB: the origin's 3-byte answer is never compressed, as the issue's "off for
    # small answers" asks.
    compress = {"types": ["text/*"], "min_bytes": 1024}
    light = {"limits": limits, "redirects": redirects, "headers": headers,
             "affinity": affinity, "basic_auth": basic_auth, "compress": compress}
    return [
        ("plain", {}, ()),
        ("redirects", {"redirects": redirects}, ()),
        ("app_pages", {"error_pages": {"502": "<h1>down</h1>"}}, ()),
        ("limits", {"limits": limits}, ()),
        ("basic_auth", {"basic_auth": basic_auth}, (auth,)),
        ("affinity", {"affinity": affinity}, ()),
        ("compress", {"compress": compress}, ("Accept-Encoding: gzip, br",)),
        ("header_rules", {"headers": headers}, ()),
        ("cache (hits)", {"cache": {"paths": ["/"], "default_ttl_s": 3600}}, ()),
        ("all light switches", light, (auth, "Accept-Encoding: gzip, br")),
        # Under valgrind a bcrypt check (~2M instructions) can miss the pool's deadline and
        # be run again by later requests, a number that differs between runs: the same app
        # without its password gives the figure that does not move.
        ("light switches but basic auth", {k: v for k, v in light.items() if k != "basic_auth"},
         ("Accept-Encoding: gzip, br",)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--only", action="append", help="a row's label (repeatable)")
    parser.add_argument("--floor", action="store_true", help="measure h1-floor too")
    parser.add_argument("--target", default="switchyard", choices=["switchyard", "switchyard-before"],
                        help="switchyard-before: the build at $SWITCHYARD_BEFORE_BIN")
    args = parser.parse_args()
    args.tool, args.scheme, args.http2 = "callgrind", "http", False
    if not shutil.which("valgrind"):
        sys.exit("valgrind is missing: bench/run installs it (Debian's valgrind package)")
    work = Path(tempfile.mkdtemp(prefix="price-list-"))
    measured = {}
    with bench.Started() as processes:
        origin, backend, _ = R.start_origin(work)
        processes.append(origin)
        targets = [("h1-floor", "h1-floor", None, ())] if args.floor else []
        targets += [(label, args.target, options, fields)
                    for label, options, fields in rows(bcrypt_hash())
                    if not args.only or label in args.only]
        for label, name, options, fields in targets:
            tag = label.replace(" ", "-").replace("(", "").replace(")", "")
            few, few_total = I.one_run(name, work, backend, args, None, 0, options, fields, tag)
            many, many_total = I.one_run(name, work, backend, args, None, args.requests,
                                         options, fields, tag)
            per_request = (many_total[0] - few_total[0]) / max(many - few, 1)
            measured[label] = per_request
            print(f"{label}: {per_request:,.0f} instructions per request "
                  f"({many - few} requests between the runs)", flush=True)
    plain = measured.get("plain")
    print("\n| app | instructions / request | vs plain |\n|---|---|---|")
    for label, value in measured.items():
        ratio = f"{value / plain:.2f}×" if plain else "–"
        print(f"| {label} | {value:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
