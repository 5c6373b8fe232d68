"""The WebSocket echo backend behind the proxies in the Autobahn run (bench/conformance/autobahn_testsuite.py).

Autobahn's own echo server, so the backend is conformant by construction, with two changes from
`wstest -m echoserver`: it has no URL, because behind a proxy the Host header names the proxy's
port, not this one, and Autobahn refuses a handshake whose Host port is not its own; and it
accepts permessage-deflate, so the compression cases (12.*, 13.*) cross the proxy too.

Runs in the Autobahn|Testsuite environment (Python 2.7): autobahn_echo.py PORT
"""

import sys

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.compress import PerMessageDeflateOffer, PerMessageDeflateOfferAccept
from twisted.internet import reactor


class Echo(WebSocketServerProtocol):
    def onMessage(self, payload, isBinary):
        self.sendMessage(payload, isBinary)


def accept_deflate(offers):
    for offer in offers:
        if isinstance(offer, PerMessageDeflateOffer):
            return PerMessageDeflateOfferAccept(offer)


def main():
    factory = WebSocketServerFactory()
    factory.protocol = Echo
    # The 9.* cases send messages of up to 16 MiB in one frame or in many.
    factory.setProtocolOptions(perMessageCompressionAccept=accept_deflate,
                               maxFramePayloadSize=0, maxMessagePayloadSize=0)
    reactor.listenTCP(int(sys.argv[1]), factory, interface="127.0.0.1")
    reactor.run()


if __name__ == "__main__":
    main()
