"""Hostile HTTP/TLS clients, for the web tests and benches/bench_web_hostile.py.

Run as a script in its own process (so that the attackers do not share the
GIL with the server or the legitimate client under measurement):

    python tests/support/hostile.py --port P --tls --kind idle:125 --kind slowloris:125 \
        --kind silent:125 --kind nocert:125 --source 127.0.0.2 --source 127.0.0.3 ...

Kinds, each a number of connections kept open at all times (re-opened as
soon as the server drops one):

- ``idle``: one ``GET /healthz`` (with ``--cert`` under mTLS), then the
  connection is kept open, saying nothing;
- ``slowloris``: a request line, then one header byte every ``--drip``
  seconds, never ending the headers;
- ``silent``: a TCP connection that never speaks (under TLS: never sends a
  ClientHello);
- ``nocert``: a TLS handshake without a client certificate, against a server
  that requires one, over and over.

Connections are spread over the ``--source`` addresses (loopback addresses
other than the server's own, so that the server sees other hosts). It prints
one JSON line of counts when it gets SIGTERM or SIGINT, and "ready" on stderr
once every connection was opened once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import sys
from collections import Counter


def client_context(cert: tuple[str, str] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    if cert is not None:
        ctx.load_cert_chain(cert[0], cert[1])
    return ctx


class Attack:
    def __init__(self, host: str, port: int, tls: bool, cert: tuple[str, str] | None, drip: float) -> None:
        self.host, self.port, self.drip = host, port, drip
        self.tls = client_context(cert) if tls else None
        self.bare = client_context(None) if tls else None
        self.counts: Counter[str] = Counter()
        self.opened = 0

    async def _open(self, source: str, ssl_ctx: ssl.SSLContext | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, local_addr=(source, 0), ssl=ssl_ctx,
                                    ssl_handshake_timeout=30 if ssl_ctx else None),
            timeout=30,
        )

    async def worker(self, kind: str, source: str, first: asyncio.Event) -> None:
        while True:
            try:
                await getattr(self, kind)(source, first)
            except (TimeoutError, OSError, ssl.SSLError, asyncio.IncompleteReadError, ConnectionError):
                self.counts[f"{kind}_dropped"] += 1
            if not first.is_set():
                first.set()
                self.opened += 1
            await asyncio.sleep(0.05)  # re-open at once, without spinning on a refused port

    async def idle(self, source: str, first: asyncio.Event) -> None:
        reader, writer = await self._open(source, self.tls)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            self.counts["idle_held"] += 1
            self._mark(first)
            while await reader.read(1024):  # hold the keep-alive until the server closes it
                pass
        finally:
            writer.close()

    async def slowloris(self, source: str, first: asyncio.Event) -> None:
        reader, writer = await self._open(source, self.tls)
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nX-a: ")
            await writer.drain()
            self.counts["slowloris_opened"] += 1
            self._mark(first)
            while True:
                await asyncio.sleep(self.drip)
                writer.write(b"a")
                await writer.drain()
                if reader.at_eof():
                    return
        finally:
            writer.close()

    async def silent(self, source: str, first: asyncio.Event) -> None:
        reader, writer = await self._open(source, None)
        try:
            self.counts["silent_opened"] += 1
            self._mark(first)
            await reader.read(1)  # until the server drops it
        finally:
            writer.close()

    async def nocert(self, source: str, first: asyncio.Event) -> None:
        reader, writer = await self._open(source, self.bare)  # fails, under a server that requires a cert
        try:
            self.counts["nocert_handshaken"] += 1
            self._mark(first)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: agent\r\n\r\n")
            await writer.drain()
            await reader.read(1)
        finally:
            writer.close()

    def _mark(self, first: asyncio.Event) -> None:
        if not first.is_set():
            first.set()
            self.opened += 1


async def main(args: argparse.Namespace) -> int:
    cert = (args.cert, args.key) if args.cert else None
    attack = Attack(args.host, args.port, args.tls, cert, args.drip)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks, firsts = [], []
    n = 0
    for spec in args.kind:
        kind, _, count = spec.partition(":")
        for _ in range(int(count)):
            first = asyncio.Event()
            firsts.append(first)
            tasks.append(asyncio.create_task(attack.worker(kind, args.source[n % len(args.source)], first)))
            n += 1
    await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), timeout=120)
    print("ready", file=sys.stderr, flush=True)
    await stop.wait()
    print(json.dumps(dict(attack.counts)), flush=True)
    os._exit(0)  # at once: hundreds of connections in flight need no goodbye
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--cert", default="")
    ap.add_argument("--key", default="")
    ap.add_argument("--drip", type=float, default=2.0, help="seconds between slowloris bytes")
    ap.add_argument("--kind", action="append", default=[], help="KIND:COUNT (idle, slowloris, silent, nocert)")
    ap.add_argument("--source", action="append", default=[], help="source addresses, used in turn")
    args = ap.parse_args(argv)
    args.source = args.source or ["127.0.0.2"]
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
