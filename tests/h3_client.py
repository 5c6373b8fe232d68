#!/usr/bin/env python3
"""An HTTP/3 client not written here (aioquic's QUIC and HTTP/3), for tests/http3.rs:
one request over a new QUIC connection, verifying the server's certificate against a CA
file, and one line of JSON on stdout: the status, the fields, the body's length and its
text (or the stream's reset / the connection's error), and the SHA-256 of the leaf served.

    h3_client.py --port P --server-name NAME --ca FILE [--method M] [--path /p]
                 [--header "name: value"]... [--body-bytes N] [--declared-length N]
                 [--body-chunks K --chunk-interval-ms MS] [--resume [--replay]]
                 [--reset-burst N]
"""

import argparse
import asyncio
import json
import ssl
import sys

from aioquic.asyncio import connect
from cryptography.hazmat.primitives import hashes
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StopSendingReceived, StreamReset


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.done = asyncio.get_event_loop().create_future()
        self.answer = {"status": None, "headers": [], "body": b""}
        # The error code of a STOP_SENDING the server sent, if it asked the client to stop
        # sending a body.
        self.stop_sending = None

    def quic_event_received(self, event):
        if isinstance(event, StopSendingReceived):
            self.stop_sending = event.error_code
        if isinstance(event, StreamReset):
            self.finish({"reset": event.error_code})
        elif isinstance(event, ConnectionTerminated):
            self.finish({"closed": event.error_code, "reason": event.reason_phrase})
        for h3_event in self.h3.handle_event(event):
            if isinstance(h3_event, HeadersReceived):
                for name, value in h3_event.headers:
                    if name == b":status":
                        self.answer["status"] = int(value)
                    else:
                        self.answer["headers"].append([name.decode(), value.decode()])
                if h3_event.stream_ended:
                    self.finish({})
            elif isinstance(h3_event, DataReceived):
                self.answer["body"] += h3_event.data
                if h3_event.stream_ended:
                    self.finish({})

    def finish(self, extra):
        if not self.done.done():
            self.done.set_result(extra)


def request_fields(args):
    fields = [(b":method", args.method.encode()), (b":scheme", b"https"),
              (b":authority", args.server_name.encode()), (b":path", args.path.encode())]
    for header in args.header:
        # A pseudo-header (":protocol: websocket") begins with its own colon.
        colon = header.index(":", 1)
        name, value = header[:colon], header[colon + 1:]
        fields.append((name.strip().lower().encode(), value.strip().encode()))
    return fields


async def exchange(args, config, wait_connected=True, tickets=None):
    """One request on a new connection: (the client, what it saw beyond the answer)."""
    async with connect("127.0.0.1", args.port, configuration=config, create_protocol=Client,
                       wait_connected=wait_connected,
                       session_ticket_handler=tickets.append if tickets is not None else None) as client:
        stream = client._quic.get_next_available_stream_id()
        fields = request_fields(args)
        body = b"x" * args.body_bytes if args.body_bytes is not None else None
        if body is not None:
            declared = args.declared_length if args.declared_length is not None else len(body)
            fields.append((b"content-length", str(declared).encode()))
        client.h3.send_headers(stream, fields, end_stream=body is None)
        if body is not None:
            size = -(-len(body) // args.body_chunks)
            pieces = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
            for i, piece in enumerate(pieces):
                if i > 0:
                    await asyncio.sleep(args.chunk_interval_ms / 1000)
                if client.stop_sending is not None or client.done.done():
                    break  # answered, or asked to stop: the rest is not wanted
                client.h3.send_data(stream, piece, end_stream=i == len(pieces) - 1)
                client.transmit()
        client.transmit()
        extra = await asyncio.wait_for(client.done, 20)
        # The leaf the handshake was served, to tell a rotated certificate.
        peer = client._quic.tls._peer_certificate
        if peer is not None:
            extra["cert_sha256"] = peer.fingerprint(hashes.SHA256()).hex()
        extra["early_data_accepted"] = client._quic.tls.early_data_accepted
        if client.stop_sending is not None:
            extra["stop_sending"] = client.stop_sending
    return client, extra


async def reset_burst(args):
    cancelled = 0x10C  # H3_REQUEST_CANCELLED
    async with connect("127.0.0.1", args.port, configuration=configuration(args),
                       create_protocol=Client, wait_connected=True) as client:
        quic = client._quic
        sent = 0
        while sent < args.reset_burst:
            # A round a browser might make: requests sent, then all cancelled (a page left).
            streams = []
            for _ in range(min(100, args.reset_burst - sent)):
                stream = quic.get_next_available_stream_id()
                client.h3.send_headers(stream, request_fields(args), end_stream=True)
                streams.append(stream)
            client.transmit()
            for _ in range(200):
                if not quic._streams_blocked_bidi:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.05)
            for stream in streams:
                quic.reset_stream(stream, cancelled)
                try:
                    quic.stop_stream(stream, cancelled)
                except ValueError:
                    pass  # aioquic has let go of a stream its answer ended
            client.transmit()
            sent += len(streams)
        await asyncio.sleep(0.5)
        print(json.dumps({"sent": sent, "blocked": len(quic._streams_blocked_bidi)}))


async def reset_unsent(args):
    """Opens streams and resets each before its HEADERS leave (aioquic then sends only the
    RESET_STREAM, with no data), never past the credit the router gave (aioquic would reset
    a stream still waiting for credit, which the router rightly takes as a violation), then
    asks once more on the same connection. Prints how many were reset, whether credit ran
    out for good (`starved`), and the last request's answer."""
    cancelled = 0x10C  # H3_REQUEST_CANCELLED
    async with connect("127.0.0.1", args.port, configuration=configuration(args),
                       create_protocol=Client, wait_connected=True) as client:
        quic = client._quic
        sent, waited = 0, 0
        while sent < args.reset_unsent and waited < 100:
            available = quic._remote_max_streams_bidi - quic._local_next_stream_id_bidi // 4
            if available <= 0:
                waited += 1
                await asyncio.sleep(0.05)
                continue
            waited = 0
            for _ in range(min(50, available, args.reset_unsent - sent)):
                stream = quic.get_next_available_stream_id()
                client.h3.send_headers(stream, request_fields(args), end_stream=True)
                quic.reset_stream(stream, cancelled)
                sent += 1
            client.transmit()
            await asyncio.sleep(0.01)
        client.done = asyncio.get_event_loop().create_future()
        client.answer = {"status": None, "headers": [], "body": b""}
        stream = quic.get_next_available_stream_id()
        client.h3.send_headers(stream, request_fields(args), end_stream=True)
        client.transmit()
        try:
            extra = await asyncio.wait_for(client.done, 5)
        except asyncio.TimeoutError:
            extra = {"timeout": True}
        print(json.dumps({"sent": sent, "starved": waited >= 100,
                          "after": {"status": client.answer["status"], **extra}}))


def configuration(args):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN,
                               server_name=args.server_name, verify_mode=ssl.CERT_REQUIRED)
    config.load_verify_locations(args.ca)
    return config


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server-name", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--method", default="GET")
    parser.add_argument("--path", default="/")
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--body-bytes", type=int, default=None)
    parser.add_argument("--declared-length", type=int, default=None)
    # The body sent in K pieces, MS apart: an upload that lasts.
    parser.add_argument("--body-chunks", type=int, default=1)
    parser.add_argument("--chunk-interval-ms", type=int, default=0)
    # A first connection (GET /) for a session ticket, then the request on a second one
    # that resumes it, sent at once: in 0-RTT data when the ticket allows it.
    parser.add_argument("--resume", action="store_true")
    # With --resume: the same ticket used once more, as a replay would.
    parser.add_argument("--replay", action="store_true")
    # N GETs in rounds of 100, each round cancelled (RESET_STREAM and STOP_SENDING) 50 ms
    # after it was sent: HTTP/2's "rapid reset" (CVE-2023-44487) over HTTP/3. Prints how
    # many were sent and how many still wait for the server's stream credit.
    parser.add_argument("--reset-burst", type=int, default=None)
    # Streams reset before their HEADERS leave, then one request more.
    parser.add_argument("--reset-unsent", type=int, default=None)
    args = parser.parse_args()
    if args.reset_unsent is not None:
        await reset_unsent(args)
        return
    if args.reset_burst is not None:
        await reset_burst(args)
        return
    try:
        if args.resume:
            tickets = []
            first = argparse.Namespace(**{**vars(args), "method": "GET", "path": "/", "header": [],
                                          "body_bytes": None, "declared_length": None})
            await exchange(first, configuration(args), tickets=tickets)
            config = configuration(args)
            if not tickets:
                print(json.dumps({"error": "no session ticket"}))
                return
            config.session_ticket = tickets[-1]
            client, extra = await exchange(args, config, wait_connected=False)
            extra["early_data_offered"] = tickets[-1].max_early_data_size is not None
            if args.replay:
                again = configuration(args)
                again.session_ticket = tickets[-1]
                _, replayed = await exchange(args, again, wait_connected=False)
                extra["replay_early_data_accepted"] = replayed["early_data_accepted"]
        else:
            client, extra = await exchange(args, configuration(args))
    except (ConnectionError, asyncio.TimeoutError) as e:
        print(json.dumps({"error": repr(e)}))
        return
    answer = client.answer
    body = answer.pop("body")
    answer["body_len"] = len(body)
    answer["text"] = body[:4096].decode("utf-8", "replace")
    answer.update(extra)
    print(json.dumps(answer))


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
