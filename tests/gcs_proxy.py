"""An HTTP proxy in front of the tests' GCS server (`tests.gcs_server`) that makes storage
misbehave on purpose: a latency added to every request (a bucket's tens of milliseconds),
requests answered 503 (an outage), and a callback when a request matches (kill a run
right after a checkpoint is committed). Clients reach it as they reach the server, through
`STORAGE_EMULATOR_HOST` (`env`).
"""

from __future__ import annotations

import asyncio
import http.client
import http.server
import re
import socket
import threading
import time
from typing import Callable, Optional

from tests import gcs_server

# Connections a listener holds before accepting them: a client opens tens at once (gcsfs
# reads a group of files together, in each decode worker); a smaller backlog (socketserver's
# 5, asyncio's 100) drops the rest, which wait for TCP's SYN resend (1 s, 3 s, 7 s: seconds
# per batch that no bucket takes).
LISTEN_BACKLOG = 256
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


class GcsProxy(gcs_server.Endpoint):
  """Forwards to ``upstream`` (host:port); ``latency_s`` before each request; ``fail(n)``
  answers the next n requests (matching ``pattern``) with 503; ``on(pattern, callback)``
  calls ``callback(request)`` on a matching one before it is forwarded. A pattern is searched in
  'METHOD path body' (the body's first KiB: an upload names its object there)."""

  def __init__(self, upstream_url: str, latency_s: float = 0.0):
    self.upstream = upstream_url.removeprefix("http://")
    self.latency_s = latency_s
    self.requests = 0
    self._failures: list[tuple[re.Pattern, int]] = []
    self._hooks: list[tuple[re.Pattern, Callable[[str], None]]] = []
    self._lock = threading.Lock()
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):  # quiet
        pass

      def _body(self) -> Optional[bytes]:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
          chunks = []
          while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            chunk = self.rfile.read(size)
            self.rfile.readline()
            if not size:
              return b"".join(chunks)
            chunks.append(chunk)
        length = int(self.headers.get("Content-Length", 0) or 0)
        return self.rfile.read(length) if length else None

      def _forward(self) -> None:
        body = self._body()
        # What the patterns match: an upload's object name is in its body, not its URL.
        request = f"{self.command} {self.path} {(body or b'')[:1024].decode('latin-1')}"
        with proxy._lock:
          proxy.requests += 1
        for pattern, callback in list(proxy._hooks):
          if pattern.search(request):
            callback(request)
        if proxy.latency_s:
          time.sleep(proxy.latency_s)
        if proxy._take_failure(request):
          self._reply(503, {"Content-Type": "application/json"}, b'{"error": {"code": 503, '
                      b'"message": "injected outage"}}')  # fmt: skip
          return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Host"] = proxy.upstream
        if body is not None:
          headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
        try:
          conn.request(self.command, self.path, body=body, headers=headers)
          response = conn.getresponse()
          data = response.read()
          out = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
          self._reply(response.status, out, data)
        finally:
          conn.close()

      def _reply(self, status: int, headers: dict[str, str], data: bytes) -> None:
        self.send_response(status)
        for k, v in headers.items():
          if k.lower() != "content-length":
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
          self.wfile.write(data)

      do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _forward

    class Server(http.server.ThreadingHTTPServer):
      request_queue_size = LISTEN_BACKLOG

      def handle_error(self, request, client_address):  # a client gone (killed, timed out)
        pass

    self._server = Server(("127.0.0.1", 0), Handler)
    self.port = self._server.server_address[1]
    self._server.daemon_threads = True
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
    self._thread.start()

  def fail(self, count: int, pattern: str = "") -> None:
    """Answers the next ``count`` requests that match ``pattern`` with 503."""
    with self._lock:
      self._failures.append((re.compile(pattern), count))

  def on(self, pattern: str, callback: Callable[[str], None]) -> None:
    self._hooks.append((re.compile(pattern), callback))

  def _take_failure(self, request: str) -> bool:
    with self._lock:
      for k, (pattern, left) in enumerate(self._failures):
        if left and pattern.search(request):
          self._failures[k] = (pattern, left - 1)
          return True
    return False

  def close(self) -> None:
    self._server.shutdown()
    self._server.server_close()


class LatencyRelay(gcs_server.Endpoint):
  """A TCP relay to ``upstream`` (host:port) that holds each request ``latency_s`` before
  forwarding it, and does nothing else: a bucket's latency for the throughput benchmark at a
  fraction of `GcsProxy`'s CPU (no HTTP parsing, no thread or upstream connection per
  request; a client's keep-alive connection is one upstream connection). A request is the
  client's first bytes after the previous answer; ``requests`` counts them."""

  def __init__(self, upstream_url: str, latency_s: float = 0.0):
    self.upstream = upstream_url.removeprefix("http://")
    self.latency_s = latency_s
    self.requests = 0
    self._loop = asyncio.new_event_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    self.port = listener.getsockname()[1]
    started = threading.Event()

    def run() -> None:
      asyncio.set_event_loop(self._loop)
      self._server = self._loop.run_until_complete(
        asyncio.start_server(self._relay, sock=listener, backlog=LISTEN_BACKLOG)
      )
      started.set()
      self._loop.run_forever()

    self._thread = threading.Thread(target=run, daemon=True)
    self._thread.start()
    started.wait()

  async def _relay(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter):
    host, port = self.upstream.rsplit(":", 1)
    upstream_in, upstream_out = await asyncio.open_connection(host, int(port))
    answered = asyncio.Event()  # set once the upstream has answered the last request
    answered.set()

    async def requests() -> None:
      while data := await client_in.read(1 << 20):
        if answered.is_set():  # the first bytes of a new request
          answered.clear()
          self.requests += 1
          if self.latency_s:
            await asyncio.sleep(self.latency_s)
        upstream_out.write(data)
        await upstream_out.drain()
      upstream_out.close()

    async def answers() -> None:
      while data := await upstream_in.read(1 << 20):
        answered.set()
        client_out.write(data)
        await client_out.drain()
      client_out.close()

    try:
      await asyncio.gather(requests(), answers())
    except (ConnectionError, OSError, asyncio.CancelledError):
      pass  # a client gone (a row's process ended), or the relay closing
    finally:
      for writer in (client_out, upstream_out):
        writer.close()

  def close(self) -> None:
    async def stop() -> None:
      self._server.close()
      tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
      for task in tasks:
        task.cancel()
      await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(timeout=10)
