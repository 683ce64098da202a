"""The private JAX, jaxlib and Orbax APIs vit_jax uses (`vit_jax/infra/compat.py`): each is there
in the installed packages; a missing one is one line naming it and the installed versions,
where it is used too: an error (a command's `Error:` line), or, for the two newer than
setup.py's oldest versions, one warning and vit_jax without it (Orbax's save runner, which
once did nothing, silently, on an Orbax without it)."""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest
from absl import logging

from vit_jax import cli, convert
from vit_jax.infra import compat
from vit_jax.run import save_loop

VERSIONS = ", ".join(
  f"{p} {importlib.metadata.version(p)}" for p in ("jax", "jaxlib", "orbax-checkpoint")
)
OPTIONAL = sorted(k for k, hook in compat.HOOKS.items() if hook.without)


def _remove(monkeypatch, key: str) -> None:
  """Takes hook ``key``'s attribute away from its module, for this test."""
  hook = compat.HOOKS[key]
  monkeypatch.delattr(importlib.import_module(hook.module), hook.name)


def test_every_hook_is_in_the_installed_packages():
  for key in compat.HOOKS:
    assert compat.resolve(key) is not None, key
  assert compat.versions() == VERSIONS
  assert OPTIONAL == ["amd_gpus", "orbax_loop_runner"]
  assert isinstance(compat.backends_started(), bool)
  assert isinstance(compat.accelerator_attached(), bool)
  assert isinstance(compat.on_cloud_tpu_vm(), bool)


@pytest.mark.parametrize("key", sorted(compat.HOOKS))
def test_a_missing_hook_is_one_line_naming_it_and_the_versions(monkeypatch, key):
  _remove(monkeypatch, key)
  hook = compat.HOOKS[key]
  with pytest.raises(compat.MissingHookError) as raised:
    compat.resolve(key)
  advice = f"{hook.since} or later" if hook.since else "the versions setup.py allows"
  assert str(raised.value) == (
    f"vit_jax uses {hook.module}.{hook.name} ({hook.use}), which the installed "
    f"{VERSIONS} lack: install {advice}."
  )


def test_an_orbax_without_its_save_runner_is_one_warning_not_nothing(monkeypatch):
  _remove(monkeypatch, "orbax_loop_runner")
  monkeypatch.setattr(compat, "_WARNED", set())
  warnings = []
  monkeypatch.setattr(logging, "warning", lambda msg, *args: warnings.append(msg % args))
  assert save_loop.drain_before_close() is False
  assert save_loop.drain_before_close() is False  # warned once
  assert warnings == [
    "vit_jax uses orbax.checkpoint._src.asyncio_utils._run_sync_via_new_loop (Orbax's "
    "save-loop runner, to drain a save's loop before it closes), which the installed "
    f"{VERSIONS} lack (orbax-checkpoint 0.12.5 has it): a save that fails (a full disk) "
    "may print Orbax's own tracebacks before its error."
  ]


def test_a_jax_without_the_amd_check_looks_for_the_other_accelerators(monkeypatch):
  _remove(monkeypatch, "amd_gpus")
  monkeypatch.setattr(compat, "_WARNED", set())
  monkeypatch.setattr(logging, "warning", lambda msg, *args: None)
  chips = compat.resolve("tpu_chips")()[0]
  assert compat.accelerator_attached() == bool(chips or compat.resolve("nvidia_gpu")())
  assert compat._WARNED == {"amd_gpus"}


def test_a_command_on_a_jax_without_a_hook_ends_in_one_error_line(monkeypatch, capsys):
  _remove(monkeypatch, "backends_started")
  assert convert.main(["convert", "--help"]) == cli.USER_ERROR_STATUS
  assert capsys.readouterr().err.splitlines() == [
    "Error: vit_jax uses jax._src.xla_bridge.backends_are_initialized (whether a JAX "
    f"backend has started), which the installed {VERSIONS} lack: install the versions "
    "setup.py allows."
  ]
