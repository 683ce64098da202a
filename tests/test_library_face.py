"""The library can be as quiet as the commands: a user's script that imports jax, calls
`platforms.quiet_start()` (the commands' start) and uses vit_jax (a model, the input
pipeline's image functions) prints only its own output, on a host with the test extras
(libtpu, JAX's CUDA plugin) and no accelerator, with nothing chosen in its environment.
(`import vit_jax` alone changes nothing: tests/test_imports.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests import fresh_python

SCRIPT = """
  import jax
  import jax.numpy as jnp
  import numpy as np
  from vit_jax import models
  from vit_jax.infra import platforms
  from vit_jax.data import host_images

  platforms.quiet_start()

  config = models.get_model_config("testing")
  model = models.create_model(config, num_classes=3)
  x = jnp.zeros((1, 16, 16, 3))
  params = model.init(jax.random.PRNGKey(0), x)["params"]
  image = host_images.resize_bilinear(np.zeros((8, 8, 3), np.uint8), (16, 16))
  print("logits", model.apply({"params": params}, x).shape, "image", tuple(image.shape))
  print("devices", jax.devices())
"""


def _user_env() -> dict[str, str]:
  """This environment as a user's shell: no platform chosen, nothing hidden, no log level."""
  env = fresh_python.clean_env()
  for name in ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "TF_CPP_MIN_LOG_LEVEL"):
    env.pop(name, None)
  return env


def test_a_script_using_vit_jax_after_import_jax_prints_only_its_own_output():
  proc = subprocess.run(
    [sys.executable, "-c", textwrap.dedent(SCRIPT)],
    cwd=fresh_python.REPO,
    env=_user_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.splitlines() == [
    "logits (1, 3) image (16, 16, 3)",
    "devices [CpuDevice(id=0)]",
  ]
  assert proc.stderr == ""


def test_a_platform_the_user_chose_is_kept():
  code = "import jax; jax.config.update('jax_platforms', 'cpu,tpu')\n"
  code += "from vit_jax.infra import platforms; platforms.quiet_start()\n"
  code += "print(jax.config.jax_platforms)"
  proc = subprocess.run(
    [sys.executable, "-c", code],
    cwd=fresh_python.REPO,
    env=_user_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0 and proc.stdout.strip() == "cpu,tpu", proc.stderr[-3000:]
