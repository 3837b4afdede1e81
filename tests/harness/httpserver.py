"""The threaded HTTP server of the test doubles (fault proxy, token server).

``socketserver`` prints every exception of a handler thread to stderr ("Exception occurred
during processing of request from ...", then a traceback), outside pytest's capture when it
happens between tests. Clients of these servers hang up on purpose (timeouts, stalls, a
client closed mid-answer): that is not an error. Anything else is logged, where pytest
captures it and shows it with the failing test.
"""

from __future__ import annotations

import logging
import ssl
import sys
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("tests.harness.httpserver")

#: What a client hanging up looks like from the handler thread.
HANGUPS = (ConnectionError, TimeoutError, ssl.SSLError)


class QuietHTTPServer(ThreadingHTTPServer):
    """:class:`ThreadingHTTPServer` whose handler errors are logged, not printed, and
    whose clients' hang-ups are not errors. Handler threads are daemons."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Called by ``socketserver`` inside ``except``: log the exception unless the
        client hung up."""
        exc = sys.exc_info()[1]
        if isinstance(exc, HANGUPS):
            log.debug("client %s hung up: %r", client_address, exc)
            return
        log.error("error while serving %s", client_address, exc_info=True)
