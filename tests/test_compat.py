"""The private JAX, jaxlib and Orbax APIs vit_jax uses (`vit_jax/compat.py`): each is there
in the installed packages, and one that is missing is one line naming it and the installed
versions, where it is used too (a command's `Error:` line; Orbax's save runner, which once
did nothing, silently, on an Orbax without it)."""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest

from vit_jax import cli, compat, convert
from vit_jax.run import save_loop

VERSIONS = ", ".join(
  f"{p} {importlib.metadata.version(p)}" for p in ("jax", "jaxlib", "orbax-checkpoint")
)


def _remove(monkeypatch, key: str) -> None:
  """Takes hook ``key``'s attribute away from its module, for this test."""
  hook = compat.HOOKS[key]
  monkeypatch.delattr(importlib.import_module(hook.module), hook.name)


def test_every_hook_is_in_the_installed_packages():
  for key in compat.HOOKS:
    assert compat.resolve(key) is not None, key
  assert compat.versions() == VERSIONS
  assert isinstance(compat.backends_started(), bool)
  assert isinstance(compat.accelerator_attached(), bool)
  assert isinstance(compat.on_cloud_tpu_vm(), bool)


@pytest.mark.parametrize("key", sorted(compat.HOOKS))
def test_a_missing_hook_is_one_line_naming_it_and_the_versions(monkeypatch, key):
  _remove(monkeypatch, key)
  hook = compat.HOOKS[key]
  with pytest.raises(compat.MissingHookError) as raised:
    compat.resolve(key)
  assert str(raised.value) == (
    f"vit_jax reads {hook.use} through {hook.module}.{hook.name}, which the installed "
    f"{VERSIONS} lack: install the versions setup.py allows."
  )


def test_an_orbax_without_its_save_runner_is_an_error_not_nothing(monkeypatch):
  _remove(monkeypatch, "orbax_loop_runner")
  with pytest.raises(compat.MissingHookError, match=r"_run_sync_via_new_loop, which the"):
    save_loop.drain_before_close()


def test_a_command_on_a_jax_without_a_hook_ends_in_one_error_line(monkeypatch, capsys):
  _remove(monkeypatch, "backends_started")
  assert convert.main(["convert", "--help"]) == cli.USER_ERROR_STATUS
  err = capsys.readouterr().err
  assert err.splitlines() == [
    "Error: vit_jax reads whether a JAX backend has started through "
    f"jax._src.xla_bridge.backends_are_initialized, which the installed {VERSIONS} lack: "
    "install the versions setup.py allows."
  ]
