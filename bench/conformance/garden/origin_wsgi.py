"""A garden origin for gunicorn (its own HTTP/1 parser): answers every request with one line
naming what the parser read (method, target, body length) and prints the same line.

    gunicorn --bind 127.0.0.1:PORT --chdir bench/conformance/garden origin_wsgi:app
"""

import sys


def app(environ, start_response):
    body = environ["wsgi.input"].read()
    target = environ.get("RAW_URI") or environ.get("PATH_INFO", "")
    line = f"{environ['REQUEST_METHOD']} {target} {len(body)}\n".encode()
    sys.stdout.buffer.write(line)
    sys.stdout.flush()
    start_response("200 OK", [("Content-Length", str(len(line)))])
    return [line]
