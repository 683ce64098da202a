"""`python -m tests.no_tensorflow MODULE ARGS...`: runs ``python -m MODULE ARGS...`` in a
process that cannot find TensorFlow (its path finder is blind to it, as if it were not
installed): the core install (`pip install -e .`) on a machine that has TensorFlow."""

import importlib.machinery
import runpy
import sys


class HideTensorFlow:
  @staticmethod
  def find_spec(name, path=None, target=None):
    if name == "tensorflow" or name.startswith("tensorflow."):
      return None
    return importlib.machinery.PathFinder.find_spec(name, path, target)

  invalidate_caches = importlib.machinery.PathFinder.invalidate_caches


if __name__ == "__main__":
  finders = sys.meta_path
  finders[:] = [HideTensorFlow if f is importlib.machinery.PathFinder else f for f in finders]
  sys.argv = sys.argv[1:]
  runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
