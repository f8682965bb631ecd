"""A bare Python HTTP hop: read the request body, post the same bytes upstream, answer with
what came back (streamed through as it arrives). No parsing, no headers beyond the content type.

The floor of a Python proxy on aiohttp: two of these in a row cost what our frontend and router
cost before either does any work of its own (``agent_shapes_bench.py`` runs it beside them).

    .venv/bin/python benchmarks/bare_hop.py --port 8001 --upstream http://127.0.0.1:8002/v1/chat/completions
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)


async def forward(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    session = request.app[SESSION]
    headers = {"content-type": request.headers.get("content-type", "application/json")}
    async with session.post(request.app[UPSTREAM], data=body, headers=headers) as upstream:
        out = web.StreamResponse(
            status=upstream.status,
            headers={"content-type": upstream.headers.get("content-type", "application/json")},
        )
        await out.prepare(request)
        async for chunk in upstream.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


async def health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the URL every request is posted to")
    args = parser.parse_args()

    async def session(app: web.Application):  # type: ignore[no-untyped-def]
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[SESSION].close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[UPSTREAM] = args.upstream
    app.cleanup_ctx.append(session)
    app.router.add_get("/health", health)
    app.router.add_post("/{tail:.*}", forward)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
