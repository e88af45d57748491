"""`mla-export serve`'s uvicorn server: a drain on SIGTERM/SIGINT that keeps answering.

uvicorn's own shutdown closes the listening socket first, so during the drain a probe of
`/health` got "connection refused" (a load balancer cannot tell that from a crash). Here the
socket stays open while requests are running: `ServerState.draining` makes `/health` and every
new generation request answer 503, the running requests finish, and only then (or after
`--shutdown-timeout` seconds, the budget of the whole drain) does uvicorn's shutdown close the
socket, cancel what is left and stop the engine. A second Ctrl-C still forces the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

import uvicorn

__all__ = ["DrainingServer"]

log = logging.getLogger("mla_export.server")
_POLL_S = 0.1
_MIN_SHUTDOWN_S = 0.5  # uvicorn's own wait after a drain that ended in time


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state):
        super().__init__(config)
        self.state = state  # the app's ServerState

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn re-raises SIGINT/SIGTERM after a graceful shutdown (so the process dies of the
        signal); the command reports the cache state and exits with its own code instead."""
        with super().capture_signals():
            try:
                yield
            finally:
                captured = getattr(self, "_captured_signals", None)
                if isinstance(captured, list):
                    captured.clear()

    async def shutdown(self, sockets=None) -> None:
        budget = self.config.timeout_graceful_shutdown
        deadline = time.monotonic() + (math.inf if budget is None else budget)
        self.state.draining = True
        if self._busy():
            log.info("draining: /health answers 503 and new requests are refused while %d running finish "
                     "(up to %s s)", len(self.server_state.tasks), budget)
        while self._busy() and not self.force_exit and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        if budget is not None:
            # Still busy: the budget is spent, uvicorn cancels the rest at once. Done: its wait
            # is for closing idle connections only (a short floor keeps it from a spurious timeout).
            self.config.timeout_graceful_shutdown = 0 if self._busy() else \
                max(deadline - time.monotonic(), _MIN_SHUTDOWN_S)
        await super().shutdown(sockets)

    def _busy(self) -> bool:
        # Requests being answered (a 503 to a probe is over within milliseconds; a stream holds
        # its task until its last chunk).
        return bool(self.server_state.tasks)
