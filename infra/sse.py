"""A lean HTTP/1.1 client for streamed (Server-Sent Events) responses: the benchmark's hot path.

httpx, used for everything else, spends ~40 us of CPU per streamed token in its layers of async generators; at
256 streams that measures the client, not the server (benchmarks/client_headroom.py). Here each connection is an
asyncio Protocol: bytes arrive in `data_received` (no task wake-up per read), the chunked transfer coding and the
SSE framing are split with bytes.find, and every `data:` payload goes to a callback with its read's arrival time.
One keep-alive connection per client; TLS through asyncio's own transport.
"""
from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

OnEvent = Callable[[bytes, float], None]  # (payload of one `data:` line, perf_counter() of the read it came in)


class StreamError(Exception):
    """The request did not complete: HTTP error status, connection lost, malformed framing or timeout."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.done: asyncio.Future | None = None

    def start(self, on_event: OnEvent) -> asyncio.Future:
        self.on_event, self.head, self.buf, self.sse = on_event, None, b"", b""
        self.status, self.mode, self.remaining, self.error_body, self.keep_alive = 0, "", 0, b"", True
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self.done and not self.done.done():
            if self.mode == "close":  # body delimited by the end of the connection (data_received passed it all on)
                self._finish()
            else:
                self._fail(f"connection closed by the server mid-response ({exc or 'EOF'})")

    def data_received(self, data: bytes) -> None:
        if self.done is None or self.done.done():
            return
        now = time.perf_counter()
        self.buf += data
        try:
            if self.head is None and not self._parse_head():
                return
            if self.mode == "chunked":
                self._dechunk(now)
            elif self.mode == "length":
                take = self.buf[:self.remaining]
                self.buf, self.remaining = self.buf[len(take):], self.remaining - len(take)
                self._body(take, now)
                if self.remaining == 0:
                    self._finish()
            else:
                self._body(self.buf, now)
                self.buf = b""
        except Exception as exc:  # noqa: BLE001 - a callback or framing error ends this request, not the loop
            self._fail(str(exc) if isinstance(exc, StreamError) else f"{type(exc).__name__}: {exc}")

    def _parse_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = self.buf[:end].decode("latin-1").split("\r\n")
        self.buf = self.buf[end + 4:]
        self.status = int(lines[0].split(" ", 2)[1])
        self.head = {k.strip().lower(): v.strip().lower() for k, v in (h.split(":", 1) for h in lines[1:] if ":" in h)}
        self.keep_alive = self.head.get("connection") != "close"
        if "chunked" in self.head.get("transfer-encoding", ""):
            self.mode = "chunked"
        elif "content-length" in self.head:
            self.mode, self.remaining = "length", int(self.head["content-length"])
            if self.remaining == 0:
                self._finish()
        else:
            self.mode, self.keep_alive = "close", False
        return True

    def _dechunk(self, now: float) -> None:
        buf, pos, pieces, last = self.buf, 0, [], False
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].split(b";", 1)[0], 16)
            if size == 0:  # last chunk; no trailers expected from an OpenAI-style server
                last = buf.find(b"\r\n", eol + 2) >= 0
                break
            if len(buf) < eol + 2 + size + 2:
                break
            pieces.append(buf[eol + 2:eol + 2 + size])
            pos = eol + 2 + size + 2
        self.buf = b"" if last else buf[pos:]
        if pieces:
            self._body(b"".join(pieces), now)  # the events of one read share its arrival time
        if last:
            self._finish()

    def _body(self, piece: bytes, now: float) -> None:
        if self.status != 200:
            self.error_body += piece
            return
        if b"\r" in piece:
            piece = piece.replace(b"\r\n", b"\n")
        events = (self.sse + piece).split(b"\n\n")
        self.sse = events.pop()
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:  # the usual shape: one data line
                self.on_event(event[6:], now)
                continue
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self.on_event(line[5:].strip(), now)

    def _finish(self) -> None:
        if self.status != 200:
            self._fail(f"HTTP {self.status}: {self.error_body[:300].decode(errors='replace')}")
        elif not self.done.done():
            self.done.set_result(None)

    def _fail(self, message: str) -> None:
        self.keep_alive = False
        if not self.done.done():
            self.done.set_exception(StreamError(message))
        if self.transport and not self.lost:
            self.transport.close()


class SseClient:
    """POSTs JSON to one server over one keep-alive connection, reopened when the server closed it."""

    def __init__(self, base_url: str, timeout_s: float, connect_timeout_s: float = 10.0,
                 tls: ssl.SSLContext | None = None, headers: dict[str, str] | None = None):
        url = urlsplit(base_url)
        self.https = url.scheme == "https"
        self.host, self.port = url.hostname or "127.0.0.1", url.port or (443 if self.https else 80)
        self.prefix = url.path.rstrip("/")
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.tls = (tls or ssl.create_default_context()) if self.https else None
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.head = (f"Host: {url.netloc}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
                     f"{extra}").encode()
        self.conn: _Connection | None = None

    async def _connection(self) -> _Connection:
        if self.conn and not self.conn.lost and self.conn.keep_alive:
            return self.conn
        self.close()
        loop = asyncio.get_running_loop()
        try:
            _, self.conn = await asyncio.wait_for(loop.create_connection(
                _Connection, self.host, self.port, ssl=self.tls, server_hostname=self.host if self.tls else None),
                self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise StreamError(f"cannot connect to {self.host}:{self.port}: {type(exc).__name__}: {exc}") from None
        return self.conn

    async def post(self, path: str, body: dict, on_event: OnEvent) -> None:
        conn = await self._connection()
        payload = json.dumps(body).encode()
        done = conn.start(on_event)
        conn.transport.write(b"POST " + (self.prefix + path).encode() + b" HTTP/1.1\r\n" + self.head
                             + b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        try:
            await asyncio.wait_for(done, self.timeout_s)
        except asyncio.TimeoutError:
            self.close()
            raise StreamError(f"no complete response within {self.timeout_s:.0f} s") from None

    def close(self) -> None:
        if self.conn and self.conn.transport and not self.conn.lost:
            self.conn.transport.close()
        self.conn = None
