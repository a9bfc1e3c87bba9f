"""An HTTP server that takes requests and never answers the POSTs: what a client spends to
send a request, before any reply, is measured against it (`replay_client.sent_only`).

It runs on a thread of its own with its own event loop, so the client's thread CPU
(`time.thread_time`) holds the client's work alone. A GET is answered (200, a model list
by default), so that connections can be opened and kept before the clock starts; a POST is
read to the end of its body, counted, and left without a reply.

Answering GETs with a decode node's `/health` instead makes it a decode worker a router
takes: what the router spends forwarding a request is measured against it
(`bench/forward_probe.py`). With a `post_reply` the POSTs are held, not dropped: each is
answered with it once `release()` is called, so the connections they came on are kept
for the next ones, as a router keeps its connections to a decode node that answers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

_MODELS = b'{"object": "list", "data": [{"id": "silent", "object": "model"}]}'


def _reply(body: bytes, content_type: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
    return head % (content_type, len(body)) + body


class SilentServer:
    """Owns its thread and loop; `on_post(n)` is called (on its thread) with the number of
    POST bodies received so far. `get_body`: the JSON every GET is answered with;
    `post_reply`: what held POSTs are answered with on `release()` (None: never)."""

    def __init__(
        self,
        on_post: Callable[[int], None] = lambda n: None,
        get_body: bytes = _MODELS,
        post_reply: bytes | None = None,
    ) -> None:
        self.on_post = on_post
        self.num_posts = 0
        self.post_paths: list[str] = []  # in the order the bodies came in
        self.port = 0
        self._get_reply = _reply(get_body)
        self._post_reply = (
            None if post_reply is None else _reply(post_reply, b"application/x-ndjson")
        )
        self._released: asyncio.Event | None = None  # made on the server's loop
        self._posts = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="silent-server", daemon=True)

    def __enter__(self) -> SilentServer:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the silent server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def wait_for_posts(self, count: int, timeout_s: float) -> bool:
        """Until `count` POST bodies have been received in all (False: not within
        `timeout_s`). Blocks the calling thread."""
        with self._posts:
            return self._posts.wait_for(lambda: self.num_posts >= count, timeout_s)

    def release(self) -> None:
        """Answer every POST held so far with `post_reply`; later ones are held again."""
        self._loop.call_soon_threadsafe(self._release_held)

    def _release_held(self) -> None:
        assert self._released is not None
        released, self._released = self._released, asyncio.Event()
        released.set()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._released = asyncio.Event()
        server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0)
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)  # the connections still open
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET "):
                    writer.write(self._get_reply)
                    await writer.drain()
                    continue
                await reader.readexactly(_content_length(head))
                with self._posts:
                    self.post_paths.append(head.split(b" ", 2)[1].decode())
                    self.num_posts += 1
                    self._posts.notify_all()
                self.on_post(self.num_posts)
                if self._post_reply is not None:
                    await self._released.wait()
                    writer.write(self._post_reply)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()  # the client went away, or the server stops (cancelled: done)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0
