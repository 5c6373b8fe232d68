#!/usr/bin/env python3
"""A closed-loop HTTP/3 load from aioquic's client (Debian's h2load and curl are built
without HTTP/3): `connections` QUIC connections, each keeping `streams` GETs in flight,
until `requests` have been answered; one line of JSON: answered, failed, seconds.
`--fresh`: every request on a connection of its own (handshake included), `connections`
of them at once; `--latency-file`: each request's milliseconds, one per line.

    h3_load.py --port P --server-name NAME [--host 127.0.0.1] [--ca FILE] [--path /]
               [--requests N] [--connections C] [--streams S] [--fresh]
               [--latency-file FILE]
"""

import argparse
import asyncio
import json
import ssl
import time

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamReset


class Loader(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}

    def get(self, authority, path):
        stream = self._quic.get_next_available_stream_id()
        done = asyncio.get_event_loop().create_future()
        self.waiting[stream] = [done, None]
        self.h3.send_headers(stream, [(b":method", b"GET"), (b":scheme", b"https"),
                                      (b":authority", authority), (b":path", path)],
                             end_stream=True)
        self.transmit()
        return done

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.waiting:
            self.waiting.pop(event.stream_id)[0].set_result(None)
        for h3_event in self.h3.handle_event(event):
            entry = self.waiting.get(getattr(h3_event, "stream_id", None))
            if entry is None:
                continue
            if isinstance(h3_event, HeadersReceived):
                entry[1] = dict(h3_event.headers).get(b":status")
            if isinstance(h3_event, (HeadersReceived, DataReceived)) and h3_event.stream_ended:
                self.waiting.pop(h3_event.stream_id)[0].set_result(entry[1])


async def timed_get(client, args, tally, latencies):
    started = time.monotonic()
    status = await client.get(args.server_name.encode(), args.path.encode())
    latencies.append((time.monotonic() - started) * 1000)
    tally["answered" if status == b"200" else "failed"] += 1


async def one_connection(args, config, budget, tally, latencies):
    async with connect(args.host, args.port, configuration=config, create_protocol=Loader,
                       wait_connected=True) as client:
        async def stream_loop():
            while budget[0] > 0:
                budget[0] -= 1
                await timed_get(client, args, tally, latencies)
        await asyncio.gather(*(stream_loop() for _ in range(args.streams)))


async def fresh_connections(args, config, budget, tally):
    while budget[0] > 0:
        budget[0] -= 1
        try:
            async with connect(args.host, args.port, configuration=config, create_protocol=Loader,
                               wait_connected=True) as client:
                await timed_get(client, args, tally, [])
        except (ConnectionError, asyncio.TimeoutError):
            tally["failed"] += 1


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server-name", required=True)
    parser.add_argument("--ca", help="verify the server against this CA (not verified without)")
    parser.add_argument("--path", default="/")
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--latency-file")
    args = parser.parse_args()
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=args.server_name,
                               verify_mode=ssl.CERT_REQUIRED if args.ca else ssl.CERT_NONE)
    if args.ca:
        config.load_verify_locations(args.ca)
    budget, tally, latencies = [args.requests], {"answered": 0, "failed": 0}, []
    started = time.monotonic()
    if args.fresh:
        await asyncio.gather(*(fresh_connections(args, config, budget, tally)
                               for _ in range(args.connections)))
    else:
        await asyncio.gather(*(one_connection(args, config, budget, tally, latencies)
                               for _ in range(args.connections)))
    if args.latency_file:
        with open(args.latency_file, "w") as out:
            out.writelines(f"{ms:.3f}\n" for ms in latencies)
    print(json.dumps({**tally, "seconds": time.monotonic() - started}))


if __name__ == "__main__":
    asyncio.run(main())
