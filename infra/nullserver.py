"""A loopback OpenAI-style streaming server that generates nothing: fixed tokens at a configurable rate.

For measuring benchmark clients (ours and `vllm bench serve`'s) without an engine in the way:
    python -m infra.nullserver --port 8123 --tokens-per-s 50 --max-tokens 64
Plain asyncio streams (no framework), HTTP/1.1 keep-alive, SSE for /v1/chat/completions and /v1/completions,
plus /health, /v1/models and an empty /metrics.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class NullServer:
    def __init__(self, tokens_per_s: float = 0.0, model: str = "null"):
        self.interval = 1 / tokens_per_s if tokens_per_s > 0 else 0.0
        self.model = model
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in lines[1:] if ":" in h)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                    await self._stream(writer, json.loads(body or b"{}"), chat=path.endswith("chat/completions"))
                else:
                    payload = {"/health": b"", "/metrics": b"# no metrics\n",
                               "/v1/models": json.dumps({"data": [{"id": self.model}]}).encode()}.get(path)
                    status = b"200 OK" if payload is not None else b"404 Not Found"
                    payload = payload or b""
                    writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: " + str(len(payload)).encode()
                                 + b"\r\n\r\n" + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception as exc:  # noqa: BLE001
            print("nullserver:", type(exc).__name__, exc, flush=True)
        finally:
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, req: dict, chat: bool) -> None:
        self.requests += 1
        n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        piece = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
        event = b"data: " + json.dumps({"id": "x", "object": "chunk", "model": self.model,
                                        "choices": [{"index": 0, **piece, "finish_reason": None}]}).encode() + b"\n\n"
        start = time.perf_counter()
        for i in range(n):
            if self.interval:
                delay = start + (i + 1) * self.interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            writer.write(_chunk(event))
            await writer.drain()
        usage = {"id": "x", "object": "chunk", "model": self.model, "choices": [],
                 "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}}
        writer.write(_chunk(b"data: " + json.dumps(usage).encode() + b"\n\n") + _chunk(b"data: [DONE]\n\n")
                     + b"0\r\n\r\n")


async def serve(port: int, tokens_per_s: float, model: str = "null", ready: asyncio.Event | None = None) -> None:
    server = await asyncio.start_server(NullServer(tokens_per_s, model).handle, "127.0.0.1", port, backlog=1024)
    if ready:
        ready.set()
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--tokens-per-s", type=float, default=0.0, help="per stream; 0 = as fast as possible")
    ap.add_argument("--model", default="null")
    args = ap.parse_args()
    asyncio.run(serve(args.port, args.tokens_per_s, args.model))
