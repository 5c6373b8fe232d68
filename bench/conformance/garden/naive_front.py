"""The garden's control: a front that smuggles on purpose. It finds where a request ends by
Content-Length alone (Transfer-Encoding ignored, as the front ends of the CL.TE attacks
did) and sends every request over one kept backend connection. The garden must report
disagreements through it; a garden that reports none here checks nothing.

    python3 naive_front.py LISTEN_PORT ORIGIN_PORT
"""

import asyncio
import sys


class Backend:
    def __init__(self, port):
        self.port = port
        self.connection = None
        self.lock = asyncio.Lock()

    async def exchange(self, request):
        async with self.lock:
            if self.connection is None:
                self.connection = await asyncio.open_connection("127.0.0.1", self.port)
            reader, writer = self.connection
            try:
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                return head + await reader.readexactly(length)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
                writer.close()
                self.connection = None
                return b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"


async def client(reader, writer, backend):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.split(b",")[0])
            body = await reader.readexactly(length)
            writer.write(await backend.exchange(head + body))
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        writer.close()


async def main():
    backend = Backend(int(sys.argv[2]))
    server = await asyncio.start_server(lambda r, w: client(r, w, backend), "127.0.0.1", int(sys.argv[1]))
    async with server:
        await server.serve_forever()


asyncio.run(main())
