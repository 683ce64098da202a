"""Start-up of the command: TensorFlow without Keras, the persistent compilation cache."""

from __future__ import annotations

from tests import fresh_python


def test_command_start_up_skips_keras_and_caches_compilations(tmp_path):
  out = fresh_python.run_json(
    """
    import json, os, sys
    import jax
    from vit_jax import main
    main._enable_compilation_cache()
    main._import_tensorflow()
    import tensorflow as tf
    print(json.dumps(dict(
      keras=sorted(m for m in sys.modules if m.split(".")[0] in ("keras", "tf_keras")),
      blocked_left=[m for m in main._KERAS_EAGER_IMPORTS if m in sys.modules],
      tf_works=float(tf.reduce_sum(tf.ones([3]))),
      cache=jax.config.jax_compilation_cache_dir,
    )))
    """,
    fresh_python.clean_env(XDG_CACHE_HOME=str(tmp_path)),
  )
  assert out["keras"] == []  # TensorFlow's eager import of Keras was skipped
  assert out["blocked_left"] == []  # and Keras still imports if asked for
  assert out["tf_works"] == 3.0
  assert out["cache"] == str(tmp_path / "vit_jax" / "xla")
