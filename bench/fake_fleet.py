"""Many fake SGLang servers in one cheap process, for bench/bench_exporter.py.

Listens on COUNT loopback ports (any free ones; printed one per line, then `ready`) and answers
/metrics, /v1/loads, /server_info and /v1/models on every port with pre-encoded responses
(status line, headers and body built once at start). One thread, one selector, non-blocking
sockets: a request costs a recv, a send or two and a close, so the fake takes as little of the
machine's CPU as a fake can, and none of it in the exporter's process. `Connection: close` on
every answer, as the exporter's client (urllib) asks for.

The process ends when its standard input closes (the benchmark that started it went away).

Run: python bench/fake_fleet.py COUNT METRICS_FILE LOADS_FILE SERVER_INFO_FILE MODELS_FILE
"""

from __future__ import annotations

import selectors
import socket
import sys

TEXT = "text/plain; version=0.0.4; charset=utf-8"
JSON = "application/json"


def response(body: bytes, content_type: str, status: str = "200 OK") -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def serve(count: int, answers: dict[bytes, bytes]) -> None:
    missing = response(b"not found\n", "text/plain", "404 Not Found")
    sel = selectors.DefaultSelector()
    for _ in range(count):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.setblocking(False)
        sel.register(listener, selectors.EVENT_READ, "listen")
        print(listener.getsockname()[1])
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    print("ready", flush=True)

    while True:
        for key, _ in sel.select():
            sock, state = key.fileobj, key.data
            if state == "stdin":
                if not sys.stdin.buffer.read1(4096):
                    return
            elif state == "listen":
                while True:
                    try:
                        conn, _ = sock.accept()
                    except BlockingIOError:
                        break
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ, [b"", None])
            elif state[1] is None:  # reading the request
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(sock)
                    sock.close()
                    continue
                state[0] += data
                if b"\r\n\r\n" not in state[0]:
                    continue
                path = state[0].split(b" ", 2)[1].split(b"?")[0]
                state[1] = memoryview(answers.get(path, missing))
                sel.modify(sock, selectors.EVENT_WRITE, state)
                _send(sel, sock, state)
            else:
                _send(sel, sock, state)


def _send(sel, sock, state) -> None:
    try:
        sent = sock.send(state[1])
    except BlockingIOError:
        return
    except OSError:
        sent = len(state[1])  # the client went away: done with it
    state[1] = state[1][sent:]
    if not state[1]:
        sel.unregister(sock)
        sock.close()


def main(argv: list[str]) -> None:
    count, metrics, loads, info, models = argv
    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()
    answers = {
        b"/metrics": response(read(metrics), TEXT),
        b"/v1/loads": response(read(loads), JSON),
        b"/server_info": response(read(info), JSON),
        b"/v1/models": response(read(models), JSON),
    }
    serve(int(count), answers)


if __name__ == "__main__":
    main(sys.argv[1:])
