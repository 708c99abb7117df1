"""The Python peers of the load harness (benches/load.rs), one per process.

    python asgi_peers.py <asgi-ratelimit|async-ratelimit> <port> <redis-url>

Each serves "ok" on every path under uvicorn with uvloop and httptools (one
worker, no access log: the fastest single-process setup either library
documents), limited per user (the `x-user` header, as in the Rust
scenarios) on Redis, with limits high enough that every request is allowed:

- asgi-ratelimit: RedisBackend, one rule with second/minute/hour limits
  (the same three windows as the Rust Redis scenarios).
- async-ratelimit: its Redis sliding-window-log algorithm through its
  Starlette middleware (it takes one window per limiter: the hour).
"""

import sys

import uvicorn
from redis.asyncio import StrictRedis

HUGE = 1_000_000_000


async def ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
    await send({"type": "http.response.body", "body": b"ok"})


def asgi_ratelimit(url):
    from ratelimit import RateLimitMiddleware, Rule
    from ratelimit.backends.redis import RedisBackend

    async def identify(scope):
        for name, value in scope["headers"]:
            if name == b"x-user":
                return value.decode(), "default"
        return "-", "default"

    return RateLimitMiddleware(
        ok,
        identify,
        RedisBackend(StrictRedis.from_url(url)),
        {r"^/": [Rule(second=HUGE, minute=HUGE, hour=HUGE)]},
    )


def async_ratelimit(url):
    from rate_limiter import (AlgorithmType, RateLimiterMiddleware,
                              RateLimiterOrchestrator, RateLimiterType)
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    limiter = RateLimiterOrchestrator(
        rate_limiter_type=RateLimiterType.REDIS,
        algorithm_type=AlgorithmType.SLIDING_WINDOW,
        max_requests=HUGE,
        time_window=3600,
        redis_client=StrictRedis.from_url(url, decode_responses=True),
    )

    async def home(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/{path:path}", home)])
    app.add_middleware(
        RateLimiterMiddleware,
        limiter=limiter,
        key_func=lambda r: r.headers.get("x-user", "-"),
    )
    return app


def main():
    name, port, url = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    app = {"asgi-ratelimit": asgi_ratelimit, "async-ratelimit": async_ratelimit}[name](url)
    # The harness keeps its connections across passes (idle for seconds in
    # between), as axum does by default; uvicorn would close them after 5 s.
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, timeout_keep_alive=600)


if __name__ == "__main__":
    main()
