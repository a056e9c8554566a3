"""A minimal HTTP GET against the agent's loopback endpoint (/metrics, /healthz, /readyz) for tests."""

from __future__ import annotations

import asyncio


async def http_get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` from 127.0.0.1:``port``: (status code, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body
