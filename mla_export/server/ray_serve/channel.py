"""The output channel: one TCP connection per (ingress, engine replica) pair that carries every
output the replica produces for that ingress, one frame per engine step.

Why not one Ray Serve stream per HTTP request (the first version): every token of every stream
was then its own streamed message replica -> ingress (gRPC, a pickle, several wake-ups), and
with the tiny model that plumbing cost more CPU than the engine (docs/RAY.md, "Where the CPU
goes"). Here a step of 16 streams is one ~1 KB frame. Ray Serve still does everything else:
the request (an `EngineCall`) is a Ray Serve call, routed by `PrefixAffinityRouter`, counted
for load and autoscaling, cancelled when the client goes, waited for on graceful shutdown;
its own stream carries only "accepted" and the final stats (wire.py).

Replica side (`ChannelServer`): a listener on the node's IP, port chosen by the OS. Each
ingress names itself with a secret token (128 random bits) in its calls, which Ray delivers;
the replica keeps one `Outbox` per token and sends its frames only to a connection that
presents that token first (a stranger who can reach the port learns nothing). A call's outputs
wait in the outbox until the ingress has connected (it connects when the first call to that
replica is accepted).

Frames: 4-byte big-endian length + a JSON list of `wire.to_wire` items.

Ingress side (`ChannelReader`): connects, sends the token, reads frames until the replica
closes or dies; then the client fails that replica's unfinished sequences (an SSE error event
each): the other replicas' channels do not notice.
"""

from __future__ import annotations

import asyncio
import json
import logging

from .wire import from_wire, to_wire

__all__ = ["ChannelServer", "Outbox", "CallSink", "ChannelReader", "HELLO", "MAX_FRAME"]

log = logging.getLogger("mla_export.server")
HELLO = "MLA-CHANNEL-1"
MAX_FRAME = 64 << 20  # a frame is one step's outputs: far below this; more is a broken peer
_HELLO_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0  # an unreachable replica address fails its calls after this, not the OS's minutes


def encode_frame(items: list) -> bytes:
    body = json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode()
    return len(body).to_bytes(4, "big") + body


class Outbox:
    """The outputs a replica owes one ingress. `put` is called on the replica's event loop (the
    engine thread hands each step's outputs over in one callback); the frame goes out once that
    callback is done, so a step is one frame. With `interval_s` > 0 frames that carry no
    sequence's first or last output wait up to that long for the next steps (fewer, bigger
    frames when steps are faster than the interval; time to first token is unchanged)."""

    def __init__(self, interval_s: float = 0.0):
        self.interval_s = float(interval_s)
        self._items: list = []
        self._writer: asyncio.StreamWriter | None = None
        self._handle: asyncio.Handle | None = None
        self._urgent = False
        self._started: set[str] = set()  # sequences that have sent an output already
        self._last_flush = 0.0
        self.calls = 0  # calls of this ingress running on the replica
        self.ever_connected = False

    def put(self, item) -> None:
        rid = item.request_id
        ends = not hasattr(item, "finished") or item.finished
        urgent = self.interval_s <= 0 or rid not in self._started or ends
        if ends:
            self._started.discard(rid)
        else:
            self._started.add(rid)
        self._items.append(to_wire(item))
        loop = asyncio.get_running_loop()
        if urgent and not self._urgent:
            if self._handle is not None:
                self._handle.cancel()
            self._urgent = True
            self._handle = loop.call_soon(self._flush)
        elif self._handle is None:
            delay = max(0.0, self._last_flush + self.interval_s - loop.time())
            self._handle = loop.call_later(delay, self._flush)

    def forget(self, request_ids) -> None:
        """Sequences aborted without a last output (their call was cancelled)."""
        self._started.difference_update(request_ids)

    def _flush(self) -> None:
        self._handle = None
        self._urgent = False
        if self._writer is None or not self._items:
            return  # sent when the ingress connects
        items, self._items = self._items, []
        self._last_flush = asyncio.get_running_loop().time()
        try:
            self._writer.write(encode_frame(items))
        except (ConnectionError, RuntimeError) as e:  # the ingress went away: its calls are cancelled by Ray
            log.warning("output channel write failed: %s", e)

    def attach(self, writer: asyncio.StreamWriter) -> None:
        if self._writer is not None and self._writer is not writer:
            self._writer.close()  # the ingress reconnected: the newer connection wins
        self._writer = writer
        self.ever_connected = True
        self._flush()

    def detach(self, writer: asyncio.StreamWriter) -> None:
        if self._writer is writer:
            self._writer = None

    @property
    def connected(self) -> bool:
        return self._writer is not None

    @property
    def pending(self) -> int:
        """Outputs not sent yet."""
        return len(self._items)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class CallSink:
    """What `EngineLoop.submit` puts one call's outputs into: they go to the ingress's outbox;
    `done` is set once every sequence of the call has ended (finished or aborted)."""

    def __init__(self, outbox: Outbox, request_ids):
        self.outbox = outbox
        self.pending = set(request_ids)
        self.done = asyncio.Event()

    def put_nowait(self, item) -> None:
        self.outbox.put(item)
        if not hasattr(item, "finished") or item.finished:
            self.pending.discard(item.request_id)
            if not self.pending:
                self.done.set()


class ChannelServer:
    """The replica's listener and its outboxes, one per ingress token."""

    def __init__(self, interval_s: float = 0.0):
        self.interval_s = interval_s
        self.address: str | None = None
        self._outboxes: dict[str, Outbox] = {}
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, host: str) -> str:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._accept, host=host, port=0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"{host}:{port}"
        return self.address

    def outbox(self, token: str) -> Outbox:
        if not token:
            raise ValueError("an engine call needs the ingress's channel token")
        box = self._outboxes.get(token)
        if box is None:
            box = self._outboxes[token] = Outbox(self.interval_s)
        return box

    def release(self, token: str) -> None:
        """Forget an outbox nobody is calling on or connected to any more. One that never had
        its connection stays while it holds outputs: a short call can end before its ingress
        has connected, and the ingress is about to fetch them."""
        box = self._outboxes.get(token)
        if box is not None and box.calls == 0 and not box.connected and (box.ever_connected or not box.pending):
            box.close()
            del self._outboxes[token]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), _HELLO_TIMEOUT_S)
        except (asyncio.TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            writer.close()
            return
        magic, _, token = line.decode("utf-8", "replace").strip().partition(" ")
        box = self._outboxes.get(token) if magic == HELLO and token else None
        if box is None:  # wrong protocol or a token no call has presented: nothing to send
            writer.close()
            return
        box.attach(writer)
        try:
            await reader.read()  # the ingress sends nothing more; b"" when it closes
        except ConnectionError:
            pass
        finally:
            box.detach(writer)
            writer.close()
            self.release(token)

    def close(self) -> None:
        """Flush and close everything; callable from any thread (the replica's destructor)."""
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if self._loop is not None and not on_loop:
            if not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._close)
            return
        self._close()

    def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for box in self._outboxes.values():
            box.close()
        self._outboxes.clear()


class ChannelReader:
    """The ingress's end of one replica's channel: `on_items(list)` per frame (decoded outputs);
    `on_closed(reason)` once, when the connection cannot be made or ends."""

    def __init__(self, address: str, token: str, on_items, on_closed):
        self.address = address
        self.token = token
        self.on_items = on_items
        self.on_closed = on_closed
        self._writer: asyncio.StreamWriter | None = None
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        reason = "closed by the replica"
        try:
            host, _, port = self.address.rpartition(":")
            reader, self._writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)),
                                                          CONNECT_TIMEOUT_S)
            self._writer.write(f"{HELLO} {self.token}\n".encode())
            await self._writer.drain()
            while True:
                n = int.from_bytes(await reader.readexactly(4), "big")
                if n > MAX_FRAME:
                    raise ValueError(f"output channel frame of {n} bytes (more than {MAX_FRAME})")
                items = [from_wire(w) for w in json.loads(await reader.readexactly(n))]
                self.on_items(items)
        except asyncio.CancelledError:
            reason = "closed by the ingress"
        except asyncio.IncompleteReadError:
            reason = "closed by the replica"
        except asyncio.TimeoutError:
            reason = f"no connection to {self.address} within {CONNECT_TIMEOUT_S:g} s"
        except (OSError, ValueError) as e:
            reason = f"{type(e).__name__}: {e}"
        finally:
            if self._writer is not None:
                self._writer.close()
            self.on_closed(reason)

    def close(self) -> None:
        self.task.cancel()
