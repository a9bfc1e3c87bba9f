"""An HTTP server that takes requests and never answers the POSTs: what a client spends to
send a request, before any reply, is measured against it (`replay_client.sent_only`).

It runs on a thread of its own with its own event loop, so the client's thread CPU
(`time.thread_time`) holds the client's work alone. A GET is answered (200, a model list),
so that connections can be opened and kept before the clock starts; a POST is read to the
end of its body, counted, and left without a reply.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

_MODELS = b'{"object": "list", "data": [{"id": "silent", "object": "model"}]}'
_GET_REPLY = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_MODELS), _MODELS)
)


class SilentServer:
    """Owns its thread and loop; `on_post(n)` is called (on its thread) with the number of
    POST bodies received so far."""

    def __init__(self, on_post: Callable[[int], None]) -> None:
        self.on_post = on_post
        self.num_posts = 0
        self.port = 0
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

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
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
                    writer.write(_GET_REPLY)
                    await writer.drain()
                    continue
                await reader.readexactly(_content_length(head))
                self.num_posts += 1
                self.on_post(self.num_posts)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()  # the client went away, or the server stops (cancelled: done)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0
