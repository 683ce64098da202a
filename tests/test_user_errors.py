"""One user-error path for every command: a bad input prints one line, exits 2 and
changes nothing.

The tables run the commands in-process (`main.main`, `predict.main`, `export.main`);
`test_each_command_entry_prints_only_the_error_line` and tests/test_main.py run real
subprocesses for the exit status and a stderr without traceback.
"""

import errno
import os
import subprocess
import sys

import ml_collections
import orbax.checkpoint as ocp
import pytest

from tests import fresh_python
from tests import interop_fixtures as fx
from tests.finished_run import copy_run, snapshot, tiny_flags
from vit_jax import export, main, predict
from vit_jax.infra import errors

pytest_plugins = ["tests.finished_run"]  # the finished_run fixture

# (id, extra command-line arguments, expected fragment of the one-line message, workdir):
# "run": a copy of the finished tiny run (resumed); "fresh": an empty folder. `{tmp}` is
# the test's tmp_path, `{finished}` the finished run. A "--config=" argument replaces the
# tiny run's config file.
CASES = [
  # The command line.
  ("unknown key", ["--config.no_such_key=3"], "Unknown config key 'no_such_key'", "fresh"),
  ("misspelt key", ["--config.lr.bse=0.1"], "closest valid keys: lr.base", "fresh"),
  ("not an int", ["--config.total_steps=abc"], "invalid literal for int()", "fresh"),
  ("unknown flag", ["--workdirr=x"], "Unknown command line flag 'workdirr'", "fresh"),
  ("positional", ["extra"], "Unexpected arguments: ['extra']", "fresh"),
  ("no config file", ["--config=configs/nope.py"], "configs/nope.py", "fresh"),
  ("bad config arg", ["--config=configs/vit.py:b16"], "must be '<model>,<dataset>'", "fresh"),
  # Loop settings.
  ("negative steps", ["--config.total_steps=-5"], "config.total_steps=-5 must be", "fresh"),
  ("log_every 0", ["--config.log_every=0"], "config.log_every=0 must be", "fresh"),
  ("checkpoint_every<0", ["--config.checkpoint_every=-1"], "checkpoint_every=-1", "fresh"),
  ("eval_every 0", ["--config.eval_every=0"], "config.eval_every=0 must be", "fresh"),
  ("keep 0", ["--config.keep_checkpoints=0"], "keep_checkpoints=0 must be", "fresh"),
  ("evaluate nothing", ["--config.total_steps=0"], "nothing to evaluate", "fresh"),
  ("warmup too long", ["--config.lr.warmup_steps=10"], "must be smaller than", "fresh"),
  # Weights.
  ("no pretrained", ["--config.pretrained={tmp}/none.npz"], "none.npz' does not exist", "fresh"),
  (
    "pretrained does not fit",
    ["--config.pretrained={finished}/checkpoints", "--config.model.hidden_size=32"],
    "checkpoints' does not fit the model",
    "fresh",
  ),
  (
    "text as npz",
    ["--config.pretrained={tmp}/text.npz", "--config.total_steps=0"],
    "text.npz': it is not a .npz archive",
    "fresh",
  ),
  (
    "empty npz",
    ["--config.pretrained={tmp}/empty.npz", "--config.total_steps=0"],
    "empty.npz': the file is empty",
    "fresh",
  ),
  # Data.
  ("unknown dataset", ["--config.dataset=no_such_set"], "neither a tfds dataset", "fresh"),
  ("no folder", ["--config.dataset=folder:/no/such/dir"], "does not exist", "fresh"),
  ("unknown split", ["--config.test_split=validation"], "'validation'", "fresh"),
  ("empty split", ["--config.train_split=train[:0]"], "selects no examples", "fresh"),
  ("class count", ["--config.num_classes=3"], "config.num_classes=3 but", "fresh"),
  ("crop 0", ["--config.pp.crop=0"], "config.pp.crop=0 must be positive", "fresh"),
  ("min_area", ["--config.pp.min_area=2.0"], "min_area=2.0 must be in (0, 1]", "fresh"),
  ("huge crop", ["--config.pp.crop=8192"], "config.pp.crop=8192 with config.batch=16", "fresh"),
  ("activations", ["--config.pp.crop=1024"], "GiB of activations per device", "fresh"),
  # Model and optimization.
  ("heads", ["--config.model.transformer.num_heads=3"], "num_heads=3", "fresh"),
  ("classifier", ["--config.model.classifier=foo"], "config.model.classifier='foo'", "fresh"),
  ("remat policy", ["--config.model.remat_policy=foo"], "model.remat_policy='foo'", "fresh"),
  ("posemb", ["--config.model.posemb=foo"], "config.model.posemb='foo'", "fresh"),
  ("posemb_resize", ["--config.posemb_resize=foo"], "config.posemb_resize='foo'", "fresh"),
  ("dtype", ["--config.model.dtype=int8"], "config.model.dtype='int8'", "fresh"),
  ("attention", ["--config.model.attention_impl=foo"], "attention_impl='foo'", "fresh"),
  ("unknown loss", ["--config.loss=foo"], "Unknown config.loss='foo'", "fresh"),
  ("unknown optimizer", ["--config.optim.name=foo"], "config.optim.name='foo'", "fresh"),
  ("unknown decay", ["--config.lr.decay=foo"], "config.lr.decay='foo'", "fresh"),
  ("weight decay<0", ["--config.optim.weight_decay=-1.0"], "weight_decay=-1.0", "fresh"),
  ("clip<0", ["--config.optim.grad_clip_norm=-1.0"], "grad_clip_norm=-1.0", "fresh"),
  ("partitioning", ["--config.partitioning=foo"], "partitioning strategy 'foo'", "fresh"),
  ("objective", ["--config.objective=foo"], "config.objective='foo'", "fresh"),
  # Resuming the run in the workdir.
  ("changed seed", ["--config.seed=7"], "seed: 0 -> 7", "run"),
  (
    "changed train split",
    ["--config.train_split=train[:90%]"],
    "train_split: 'train' -> 'train[:90%]'; num_train: 1437 -> 1293",
    "run",
  ),
  ("changed test split", ["--config.test_split=test[:50%]"], "test_split: 'test' ->", "run"),
  ("changed model", ["--config.model.hidden_size=32"], "model.hidden_size: 16 -> 32", "run"),
  ("changed batch", ["--config.batch=32"], "batch: 16 -> 32", "run"),
  ("changed shuffle", ["--config.shuffle_buffer=32"], "allow_changed_batch=True", "run"),
  ("changed crop", ["--config.pp.crop=16"], "pp.crop: 8 -> 16", "run"),
  ("changed optimizer", ["--config.optim.name=sgd"], "holds other arrays", "run"),
  ("corrupt config.json", [], "config.json is not a readable run config", "run:{"),
  ("config.json a list", [], "config.json holds a JSON list", "run:[]"),
]


@pytest.mark.parametrize(
  "args, fragment, workdir_kind", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
  args, fragment, workdir_kind, finished_run, digits_dir, tmp_path, capsys
):
  (tmp_path / "text.npz").write_text("not an archive\n")
  (tmp_path / "empty.npz").write_bytes(b"")
  workdir = str(tmp_path / "run")
  if workdir_kind.startswith("run"):
    copy_run(finished_run, workdir)
    if ":" in workdir_kind:
      with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(workdir_kind.split(":", 1)[1])
  else:
    os.makedirs(workdir)
  before = snapshot(workdir)
  flags = tiny_flags(digits_dir)
  args = [a.format(tmp=tmp_path, finished=finished_run) for a in args]
  if any(a.startswith("--config=") for a in args):
    flags = [f for f in flags if not f.startswith("--config")]
  capsys.readouterr()

  assert main.main(["main", *flags, f"--workdir={workdir}", *args]) == 2

  err = capsys.readouterr().err
  message = [line for line in err.splitlines() if line.startswith("Error: ")]
  assert len(message) == 1 and fragment in message[0], err[-2000:]
  assert "Traceback" not in err
  after = snapshot(workdir)
  assert {k: after[k] for k in before} == before  # nothing that was there changed
  assert set(after) == set(before)  # and nothing was added: no config.json, no lock


def test_case_table_has_at_least_30_inputs():
  assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


def test_out_of_disk_is_one_error_naming_the_workdir_and_bytes(
  tmp_path, digits_dir, capsys, monkeypatch
):
  def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
  workdir = str(tmp_path / "run")
  assert main.main(["main", *tiny_flags(digits_dir), f"--workdir={workdir}"]) == 2
  err = capsys.readouterr().err
  assert f"Error: Out of disk space writing to {workdir}/checkpoints" in err
  assert "bytes free; a checkpoint step of this run needs about" in err
  assert "Traceback" not in err


def test_out_of_device_memory_names_the_settings_and_the_need():
  xla = RuntimeError(
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
    "3221225472 bytes.\nBufferAssignment OOM Debugging."
  )
  config = ml_collections.ConfigDict(dict(batch=4096, accum_steps=1, model=dict(remat=False)))
  error = errors.as_user_error(xla, workdir="/w", config=config)
  assert isinstance(error, errors.OutOfMemoryError)
  message = str(error)
  assert "3.00 GiB (3,221,225,472 bytes)" in message
  for setting in (
    "config.batch (now 4096)",
    "config.accum_steps (now 1",
    "config.model.remat=True (now False)",
  ):
    assert setting in message
  assert errors.as_user_error(RuntimeError("INTERNAL: a bug"), workdir="/w", config=config) is None


@pytest.mark.parametrize(
  "workdir", ["{tmp}/file.txt", "{tmp}/file.txt/run", "/sys/vit_jax_test", "/proc/vit_jax_test"]
)
def test_an_unusable_workdir_is_one_line_exit_2(workdir, digits_dir, tmp_path, capsys):
  (tmp_path / "file.txt").write_text("a file, not a folder\n")
  workdir = workdir.format(tmp=tmp_path)
  capsys.readouterr()
  assert main.main(["main", *tiny_flags(digits_dir), f"--workdir={workdir}"]) == 2
  err = capsys.readouterr().err
  message = [line for line in err.splitlines() if line.startswith("Error: ")]
  assert len(message) == 1 and f"Cannot write to {workdir} (" in message[0], err[-2000:]
  assert "Traceback" not in err
  assert (tmp_path / "file.txt").read_text() == "a file, not a folder\n"


# (id, command module, arguments separated by spaces, expected fragment of the one-line
# message). In `{tmp}` (the test's tmp_path): m.npz (a ViT-Ti/16 checkpoint with 5
# classes), image.png, file.txt, full/ (a folder with a file) and empty/.
COMMAND_CASES = [
  (
    "predict missing image",
    predict,
    "--checkpoint={tmp}/m.npz {tmp}/nope.png",
    "nope.png: no such file or folder",
  ),
  (
    "predict not a checkpoint",
    predict,
    "--checkpoint={tmp}/empty {tmp}/image.png",
    "is a folder but neither a training run",
  ),
  (
    "predict no checkpoint",
    predict,
    "--checkpoint={tmp}/none.npz {tmp}/image.png",
    "No checkpoint at",
  ),
  (
    "predict text as npz",
    predict,
    "--checkpoint={tmp}/file.txt {tmp}/image.png",
    "it is not a .npz archive",
  ),
  ("predict no image named", predict, "--checkpoint={tmp}/m.npz", "Name at least one image"),
  (
    "predict no image in folder",
    predict,
    "--checkpoint={tmp}/m.npz {tmp}/empty",
    "No image files in",
  ),
  (
    "predict labels file",
    predict,
    "--checkpoint={tmp}/m.npz --labels={tmp}/no.txt {tmp}/image.png",
    "--labels=",
  ),
  (
    "predict label count",
    predict,
    "--checkpoint={tmp}/m.npz --labels={tmp}/file.txt {tmp}/image.png",
    "1 class names for a head of 5",
  ),
  (
    "predict resolution",
    predict,
    "--checkpoint={tmp}/m.npz --resolution=64 {tmp}/image.png",
    "--resolution=64, but",
  ),
  (
    "predict unknown flag",
    predict,
    "--chekpoint={tmp}/m.npz {tmp}/image.png",
    "Unknown command line flag 'chekpoint'",
  ),
  ("predict no --checkpoint", predict, "{tmp}/image.png", "--checkpoint is required"),
  (
    "export out not empty",
    export,
    "--checkpoint={tmp}/m.npz --format=npz --out={tmp}/full",
    "exists and is not an empty folder",
  ),
  (
    "export out under a file",
    export,
    "--checkpoint={tmp}/m.npz --format=npz --out={tmp}/file.txt/x",
    "Cannot write to {tmp}/file.txt/x",
  ),
  (
    "export unknown format",
    export,
    "--checkpoint={tmp}/m.npz --format=onnx --out={tmp}/o",
    "flag --format=onnx",
  ),
  (
    "export no checkpoint",
    export,
    "--checkpoint={tmp}/none.npz --format=npz --out={tmp}/o",
    "No checkpoint at",
  ),
  ("export no --out", export, "--checkpoint={tmp}/m.npz --format=npz", "--out is required"),
  (
    "export positional",
    export,
    "--checkpoint={tmp}/m.npz --format=npz --out={tmp}/o x",
    "Unexpected arguments: ['x']",
  ),
]


def _command_inputs(tmp_path) -> None:
  fx.write_npz(tmp_path / "m.npz", "vit_ti16")
  (tmp_path / "image.png").write_bytes(b"")  # never read: every case fails before
  (tmp_path / "file.txt").write_text("one line\n")
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "mine.txt").write_text("mine")
  (tmp_path / "empty").mkdir()


def _tree(folder) -> dict[str, bytes | None]:
  """{path: content, or None for a folder} of everything under ``folder``."""
  found = {}
  for root, dirs, files in os.walk(folder):
    found.update({os.path.join(root, d): None for d in dirs})
    found.update({os.path.join(root, f): open(os.path.join(root, f), "rb").read() for f in files})
  return found


@pytest.mark.parametrize(
  "command, args, fragment", [c[1:] for c in COMMAND_CASES], ids=[c[0] for c in COMMAND_CASES]
)
def test_bad_command_input_is_one_line_exit_2_and_changes_nothing(
  command, args, fragment, tmp_path, capsys
):
  _command_inputs(tmp_path)
  before = _tree(tmp_path)
  capsys.readouterr()

  argv = [command.__name__, *args.format(tmp=tmp_path).split()]
  assert command.main(argv) == 2

  captured = capsys.readouterr()
  message = [line for line in captured.err.splitlines() if line.startswith("Error: ")]
  assert len(message) == 1 and fragment.format(tmp=tmp_path) in message[0], captured.err[-2000:]
  assert "Traceback" not in captured.err and not captured.out
  assert _tree(tmp_path) == before  # no output, no temporary folder


@pytest.mark.parametrize(
  "module, args, message",
  [
    ("vit_jax.predict", ["--checkpoint={tmp}", "{tmp}/nope.jpg"], "{tmp}/nope.jpg: no such file"),
    (
      "vit_jax.export",
      ["--checkpoint={tmp}", "--format=hf", "--out={tmp}"],
      "--out='{tmp}' exists",
    ),
    ("vit_jax.fewshot", ["--checkpoint={tmp}"], "No config.json in or above '{tmp}'"),
  ],
)
def test_each_command_entry_prints_only_the_error_line(module, args, message, tmp_path):
  (tmp_path / "file.txt").write_text("not empty\n")
  env = {k: v for k, v in fresh_python.clean_env().items() if not k.startswith("TF_")}
  proc = subprocess.run(
    [sys.executable, "-m", module, *(a.format(tmp=tmp_path) for a in args)],
    cwd=fresh_python.REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("Error: " + message.format(tmp=tmp_path)), lines
  assert not proc.stdout
