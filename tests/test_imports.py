"""The package's layers, read from its import statements: the commands sit on top (no
other module imports one), and no module or package imports one that imports it back."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from tests import fresh_python

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "vit_jax"
# The command-line entries and what only they use.
COMMANDS = frozenset(
  {
    "vit_jax.cli",
    "vit_jax.main",
    "vit_jax.predict",
    "vit_jax.export",
    "vit_jax.convert",
    "vit_jax.fewshot",
    "vit_jax.zeroshot",
    "vit_jax.vtab",
    "vit_jax.paper_row",
    "vit_jax.plan.cli",
    "vit_jax.plan.__main__",
  }
)


def _modules() -> dict[str, pathlib.Path]:
  """Every module of the package by dotted name (a package by its own name)."""
  found = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return found


def _imports(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
  """The package's modules that ``name`` imports anywhere in its file (a function's
  imports too): `from a import b` counts a, and a.b when that is a module. The packages
  that hold ``name`` do not count: Python imports them before it in any case."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  targets = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      targets.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{parent}.{base}".rstrip(".")
      targets.update(f"{base}.{alias.name}" for alias in node.names)
      targets.add(base)
  resolved = set()
  for target in targets:
    while target and target not in modules:
      target = target.rpartition(".")[0]
    if target and not (name == target or name.startswith(target + ".")):
      resolved.add(target)
  return resolved


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
  """One cycle of ``graph`` (as its nodes, the first repeated at the end), or []."""
  state: dict[str, str] = {}  # "open" while on the path, "done" after
  path: list[str] = []

  def visit(node: str) -> list[str]:
    state[node] = "open"
    path.append(node)
    for target in sorted(graph.get(node, ())):
      if state.get(target) == "open":
        return path[path.index(target) :] + [target]
      if target not in state and (found := visit(target)):
        return found
    path.pop()
    state[node] = "done"
    return []

  for node in sorted(graph):
    if node not in state and (found := visit(node)):
      return found
  return []


def test_the_commands_are_the_top_layer(graph):
  assert COMMANDS <= set(graph)
  upward = {
    name: sorted(graph[name] & COMMANDS)
    for name in graph
    if name not in COMMANDS and graph[name] & COMMANDS
  }
  assert not upward, f"modules that import a command: {upward}"


def test_no_module_imports_itself_back(graph):
  assert not _cycle(graph)


def test_no_package_imports_itself_back(graph):
  """`vit_jax.run` importing `vit_jax.weights` means no module of `weights` imports `run`."""
  top = lambda name: ".".join(name.split(".")[:2])  # noqa: E731
  packages: dict[str, set[str]] = {}
  for name, targets in graph.items():
    packages.setdefault(top(name), set()).update(top(t) for t in targets if top(t) != top(name))
  assert not _cycle(packages)


@pytest.mark.parametrize(
  "package, below",
  [
    ("vit_jax.data", "vit_jax.models"),  # the input pipeline does not know the model
    ("vit_jax.weights", "vit_jax.run"),  # the run imports the weights
  ],
)
def test_a_package_does_not_import_what_it_must_not_know(graph, package, below):
  inside = lambda name, pkg: name == pkg or name.startswith(pkg + ".")  # noqa: E731
  found = {
    name: sorted(t for t in targets if inside(t, below))
    for name, targets in graph.items()
    if inside(name, package)
  }
  assert not {name: targets for name, targets in found.items() if targets}


def test_the_floor_imports_nothing_above_it(graph):
  """`vit_jax.infra` (errors, paths, storage, the mesh, ...) imports only its own modules."""
  floor = lambda name: name == "vit_jax.infra" or name.startswith("vit_jax.infra.")  # noqa: E731
  above = {n: sorted(t for t in ts if not floor(t)) for n, ts in graph.items() if floor(n)}
  assert {n: ts for n, ts in above.items() if ts} == {}
  assert len(above) > 10  # the floor's modules were found


def test_a_cycle_is_found():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


# Imported with TensorFlow unimportable, then a tiny train step built and run: what a GPU
# machine without TensorFlow (and a plan or weights import anywhere) needs.
_WITHOUT_TENSORFLOW = """
import importlib, json, sys

class NoTensorFlow:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("tensorflow", "tensorflow_datasets"):
      raise ImportError(f"{name} is made unimportable by the test")

sys.meta_path.insert(0, NoTensorFlow())
for name in (
  "vit_jax.models", "vit_jax.weights", "vit_jax.run", "vit_jax.plan.planner",
  "vit_jax.predict", "vit_jax.export", "configs.common",
):
  importlib.import_module(name)
import jax, numpy as np
from configs import common
from vit_jax import models, run

config = common.get_config()
config.model = models.get_model_config("testing")
config.pp.crop, config.batch, config.batch_eval, config.num_classes = 8, 4, 4, 3
steps = run.build(config, open_data=False)
labels = np.eye(3, dtype=np.float32)[[0, 1, 2, 0]]
batch = {"image": np.zeros((4, 8, 8, 3), np.float32), "label": labels}
state, metrics = steps.train_step(steps.init_state(), jax.device_put(batch, steps.batch_sharding))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "tensorflow_datasets"))
print(json.dumps({"loss": float(metrics["train/loss"]), "loaded": loaded}))
"""


def test_the_step_the_plan_and_the_weights_need_no_tensorflow():
  out = fresh_python.run_json(_WITHOUT_TENSORFLOW, fresh_python.clean_env())
  assert out["loaded"] == []
  assert abs(out["loss"] - np.log(3)) < 1e-3  # a fresh zero head: uniform over 3 classes


def test_the_data_package_loads_its_modules_on_first_use():
  out = fresh_python.run_json(
    """
    import json, sys
    from vit_jax import data
    before = "tensorflow" in sys.modules
    settings_cls = data.Settings  # TensorFlow-free
    data.train_iterator  # the pipeline: Grain, no TensorFlow
    print(json.dumps({"before": before, "after": "tensorflow" in sys.modules,
                      "name": settings_cls.__module__}))
    """,
    fresh_python.clean_env(),
  )
  assert out == {"before": False, "after": False, "name": "vit_jax.data.settings"}


def test_importing_the_package_changes_nothing_and_starts_no_jax_backend():
  """`import vit_jax`, then every module of it, in a user's environment (nothing chosen):
  no environment variable and no JAX setting changes, and no backend starts. A user's
  script keeps its own choices; a multi-process run calls `jax.distributed.initialize`
  after its config file imported the package. The quiet start is the commands'
  (`platforms.quiet_start`, tests/test_library_face.py), before TensorFlow loads."""
  env = fresh_python.clean_env()
  for name in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS"):
    env.pop(name, None)
  out = fresh_python.run_json(
    """
    import importlib, json, os, pkgutil, sys
    import cv2, jax  # their own imports change variables (LD_LIBRARY_PATH, TF_CPP_...)
    import jax._src.xla_bridge as xla_bridge
    env, config = dict(os.environ), dict(jax.config.values)

    def changes():
      names = {*env, *os.environ}
      return sorted(k for k in names if env.get(k) != os.environ.get(k)) + sorted(
        k for k in config if jax.config.values[k] != config[k]
      )

    import vit_jax
    ours = sorted(m for m in sys.modules if m.split(".")[0] == "vit_jax")
    package = dict(changes=changes(), modules=ours)
    names = [m.name for m in pkgutil.walk_packages(vit_jax.__path__, "vit_jax.")]
    for name in names:
      if not name.endswith("__main__"):
        importlib.import_module(name)
    print(json.dumps({"package": package, "changes": changes(), "modules": len(names),
                      "backends": sorted(xla_bridge._backends),
                      "tensorflow": "tensorflow" in sys.modules}))
    """,
    env,
  )
  assert out["package"] == {"changes": [], "modules": ["vit_jax"]}
  assert out["changes"] == [] and out["modules"] > 100 and out["backends"] == []
  # The commands' quiet start sets TensorFlow's log level when a command runs: no module
  # loads TensorFlow at its import.
  assert not out["tensorflow"]
