"""The benchmark's streaming client against real sockets: a scripted asyncio server writes exact bytes, split
wherever the test says, so framing across reads, errors and connection reuse are exercised for real."""
import asyncio

import pytest

from infra.sse import SseClient, StreamError
from tasks.bench import RequestRecord, _one


def chunked(*pieces: bytes) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"


OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def serve(responses: list[bytes], split: int = 0, close_after: bool = False):
    """Answers each request on a connection with the next response, written `split` bytes at a time."""
    connections = []

    async def handle(reader, writer):
        connections.append(writer)
        for response in responses:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            for i in range(0, len(response), split or len(response)):
                writer.write(response[i:i + (split or len(response))])
                await writer.drain()
                await asyncio.sleep(0.001)
            if close_after:
                writer.close()
                return
        await reader.read()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections


async def collect(client: SseClient) -> list[bytes]:
    events = []
    await client.post("/v1/chat/completions", {"x": 1}, lambda data, now: events.append(data))
    return events


@pytest.mark.parametrize("split", [0, 1, 7, 64])
def test_events_survive_any_split_of_chunks_and_sse_frames_and_connection_is_reused(split):
    body = chunked(b'data: {"a": 1}\n\ndata: {"b"', b': 2}\n\n', b'data: {"c": 3}\r\n\r\n: ping\n\n',
                   b'event: x\ndata: {"d": 4}\n\ndata: [DONE]\n\n')

    async def main():
        server, url, connections = await serve([OK_HEAD + body, OK_HEAD + body], split)
        client = SseClient(url, timeout_s=10)
        first, second = await collect(client), await collect(client)
        client.close()
        server.close()
        return first, second, len(connections)

    first, second, connections = asyncio.run(main())
    assert first == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}', b'{"d": 4}', b"[DONE]"]
    assert second == first
    assert connections == 1  # keep-alive: both requests on one connection


def test_body_without_framing_ends_with_the_connection():
    response = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {\"a\": 1}\n\ndata: [DONE]\n\n"

    async def main():
        server, url, _ = await serve([response], split=9, close_after=True)
        client = SseClient(url, timeout_s=10)
        events = await collect(client)
        reused = client.conn is not None and client.conn.keep_alive
        server.close()
        return events, reused

    events, reused = asyncio.run(main())
    assert events == [b'{"a": 1}', b"[DONE]"] and not reused  # complete, and never reused


def test_http_error_names_status_and_body():
    body = b'{"error": "model not found"}'
    response = b"HTTP/1.1 404 Not Found\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body

    async def main():
        server, url, _ = await serve([response])
        try:
            await collect(SseClient(url, timeout_s=10))
        finally:
            server.close()

    with pytest.raises(StreamError, match="HTTP 404.*model not found"):
        asyncio.run(main())


def test_server_dying_mid_stream_is_an_error_not_a_short_success():
    truncated = OK_HEAD + chunked(b'data: {"a": 1}\n\n')[:-5]  # no last chunk

    async def main():
        server, url, _ = await serve([truncated], close_after=True)
        try:
            await collect(SseClient(url, timeout_s=10))
        finally:
            server.close()

    with pytest.raises(StreamError, match="connection closed by the server mid-response"):
        asyncio.run(main())


def test_silent_server_times_out_and_refused_connection_is_named():
    async def silent():
        server = await asyncio.start_server(lambda r, w: asyncio.sleep(30), "127.0.0.1", 0)
        try:
            await collect(SseClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout_s=0.3))
        finally:
            server.close()

    with pytest.raises(StreamError, match="no complete response within"):
        asyncio.run(silent())

    async def refused():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        await collect(SseClient(f"http://127.0.0.1:{port}", timeout_s=1))

    with pytest.raises(StreamError, match="cannot connect to 127.0.0.1"):
        asyncio.run(refused())


def test_benchmark_request_records_tokens_timing_and_an_error_event():
    good = OK_HEAD + chunked(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
                             b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n',
                             b'data: {"choices":[{"delta":{"content":" there"}}]}\n\n',
                             b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
                             b'data: [DONE]\n\n')
    bad = OK_HEAD + chunked(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n',
                            b'data: {"error": {"message": "engine dead", "code": 500}}\n\n', b'data: [DONE]\n\n')

    async def main():
        server, url, _ = await serve([good, bad], split=40)
        client = SseClient(url, timeout_s=10)
        records = [await _one(client, "/v1/chat/completions", {}, RequestRecord(i)) for i in range(2)]
        client.close()
        server.close()
        return records

    ok, failed = asyncio.run(main())
    assert ok.ok and (ok.prompt_tokens, ok.completion_tokens) == (5, 2)
    assert ok.ttft_ms > 0 and len(ok.itl_ms) == 1 and ok.tpot_ms == pytest.approx(ok.itl_ms[0])  # role chunk ignored
    assert not failed.ok and "error event in the stream" in failed.error and "engine dead" in failed.error


def test_a_stop_token_chunk_without_text_counts_in_tpot_and_itl():
    """vLLM ends an EOS-stopped stream with an empty-content finish chunk; usage counts the EOS token."""
    body = OK_HEAD + chunked(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
                             b'data: {"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}\n\n',
                             b'data: {"choices":[{"delta":{"content":" there"},"finish_reason":null}]}\n\n',
                             b'data: {"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}\n\n',
                             b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
                             b'data: [DONE]\n\n')

    async def main():
        server, url, _ = await serve([body], split=40)
        client = SseClient(url, timeout_s=10)
        record = await _one(client, "/v1/chat/completions", {}, RequestRecord(0))
        client.close()
        server.close()
        return record

    record = asyncio.run(main())
    assert record.completion_tokens == 3 and len(record.itl_ms) == 2
    assert record.tpot_ms == pytest.approx(sum(record.itl_ms) / 2)
