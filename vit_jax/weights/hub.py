"""Weights that live on the Hugging Face hub, named as a hub repository or as an official file.

A source that is not on disk is resolved to a local folder here, before it is read:
  * ``hf-hub:<org>/<name>[@revision]``: the repository's `.safetensors` and `.json` files,
    through `huggingface_hub` (its cache, ``HF_HOME``, ``HF_HUB_OFFLINE``, tokens: whatever
    the environment already has);
  * an official checkpoint name (``ViT-B_16``, ``imagenet21k+imagenet2012/ViT-B_16``, an
    AugReg file stem, or the old ``gs://vit_models/...npz`` URL): the hub repository that
    hosts a copy today, from the table `hub_names.tsv` in this package (generated from
    timm's `default_cfgs` by `tools/hub_names.py`, which names the timm version).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.resources
import os
import re
import shlex
from typing import Optional

from absl import logging

from vit_jax import models
from vit_jax.infra import errors

HF_HUB = "hf-hub:"
TABLE = "hub_names.tsv"
_BUCKET_PREFIXES = ("gs://vit_models/", "https://storage.googleapis.com/vit_models/")
_PRETRAINING_FOLDER = "imagenet21k/"  # what a bare variant name (ViT-B_16) means
_FILES = ["*.safetensors", "*.json"]  # never the pickled .bin / .pth copies
_REPO_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # the hub's <org>/<name>
_REVISION = re.compile(r"[\w./-]{1,255}")


@dataclasses.dataclass(frozen=True)
class HubCopy:
  name: str  # the official path without gs://vit_models/ and .npz
  repo: str
  num_classes: int  # of the hub copy's head; 0: none (timm dropped the in21k heads)


@functools.lru_cache(maxsize=None)
def table() -> dict[str, HubCopy]:
  """The official names this package knows a hub copy of."""
  text = importlib.resources.files("vit_jax.weights").joinpath(TABLE).read_text()
  rows = (line.split("\t") for line in text.splitlines() if line and not line.startswith("#"))
  return {name: HubCopy(name, repo, int(classes)) for name, repo, classes in rows}


def _official_path(source: str) -> str:
  for prefix in _BUCKET_PREFIXES:
    if source.startswith(prefix):
      source = source[len(prefix) :]
  return source[: -len(".npz")] if source.endswith(".npz") else source


def official_copy(source: str) -> Optional[HubCopy]:
  """The hub copy of an official name, path or bucket URL; None when the table has none.

  A bare file name (``ViT-B_16``, an AugReg stem) is the one entry of that name, or the
  ImageNet-21k pre-training file where several folders have it.
  """
  name = _official_path(source)
  names = table()
  if name in names:
    return names[name]
  same_stem = [n for n in names if n.rsplit("/", 1)[-1] == name]
  if len(same_stem) == 1:
    return names[same_stem[0]]
  return names.get(_PRETRAINING_FOLDER + name)


def _looks_official(source: str) -> bool:
  """A bucket URL, or a variant name alone or in one of the bucket's folders."""
  folder, _, name = _official_path(source).rpartition("/")
  folders = {n.rsplit("/", 1)[0] for n in table()}
  in_bucket = not folder or folder in folders
  return source.startswith(_BUCKET_PREFIXES) or (in_bucket and name in models.MODEL_NAMES)


def is_hub_source(source: str) -> bool:
  """Whether ``source`` names weights on the hub rather than a path (nothing is fetched)."""
  return source.startswith(HF_HUB) or official_copy(source) is not None


def _download_command(repo: str, revision: Optional[str]) -> str:
  """The shell command that fetches ``repo`` (every interpolated name quoted)."""
  rev = f" --revision {shlex.quote(revision)}" if revision else ""
  return f"hf download {shlex.quote(repo)}{rev} --include '*.safetensors' '*.json'"


def _check_repo_name(repo: str, revision: Optional[str]) -> None:
  """A hub repository is ``<org>/<name>`` of letters, digits, ``-_.``; a revision has no
  spaces or control characters. Anything else is refused before the hub is asked."""
  if not _REPO_NAME.fullmatch(repo) or ".." in repo:
    raise errors.CommandLineError(
      f"{HF_HUB}{repo!r} is not a hub repository name: use {HF_HUB}<org>/<name> "
      "(letters, digits, '-', '_', '.')."
    )
  if revision is not None and not _REVISION.fullmatch(revision):
    raise errors.CommandLineError(
      f"{HF_HUB}{repo}@{revision!r}: not a revision (a branch, tag or commit name)."
    )


def download(repo: str, revision: Optional[str] = None) -> str:
  """The local folder of ``repo``'s safetensors and json files (the cache, or fetched)."""
  try:
    from huggingface_hub import constants, snapshot_download  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.MissingError(
      f"hf-hub:{repo} needs huggingface_hub: pip install huggingface_hub (or the package's "
      "[interop] extra)."
    ) from e
  from huggingface_hub import errors as hub_errors  # pylint: disable=g-import-not-at-top

  try:
    return snapshot_download(repo, revision=revision, allow_patterns=_FILES)
  except (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError) as e:
    raise errors.MissingError(
      f"hf-hub:{repo}{'@' + revision if revision else ''}: no such repository or revision "
      f"on the hub, or no access to it (a gated or private one needs `hf auth login` or "
      f"HF_TOKEN): {str(e).splitlines()[0]}"
    ) from e
  except (hub_errors.LocalEntryNotFoundError, hub_errors.HfHubHTTPError, OSError) as e:
    offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else ""
    raise errors.MissingError(
      f"hf-hub:{repo}: not in the Hugging Face cache {constants.HF_HUB_CACHE} and the hub "
      f"cannot be reached{offline}. On a machine with a network run "
      f"`{_download_command(repo, revision)}` (older huggingface_hub: `huggingface-cli "
      "download` with the same arguments) with HF_HOME pointing at a cache to copy here."
    ) from e


def resolve(source: str) -> str:
  """A local path for ``source``: itself when it exists, else the hub folder it names.

  A path that exists is never looked up; an unknown name is returned as it is (the
  caller reports the missing file). An official name without a hub copy is an error.
  """
  if os.path.exists(source):
    return source
  if source.startswith(HF_HUB):
    repo, at, revision = source[len(HF_HUB) :].partition("@")
    _check_repo_name(repo, revision if at else None)
    return download(repo, revision or None)
  if copy := official_copy(source):
    head = f"{copy.num_classes}-class head" if copy.num_classes else "no head"
    logging.info("%s: the hub copy is hf-hub:%s (%s).", source, copy.repo, head)
    return download(copy.repo)
  if _looks_official(source):
    stem = _official_path(source).rsplit("/", 1)[-1]
    short = stem.removeprefix("ViT-")  # AugReg stems start with the variant: B_8-i21k-...
    close = [n for n in table() if n.startswith(f"augreg/{short}-") and "--" not in n]
    close = close or difflib.get_close_matches(stem, list(table()), n=3, cutoff=0.5)
    raise errors.MissingError(
      f"{source!r}: no hub copy of this official checkpoint is known (the package's table "
      f"lists {len(table())} from timm's default_cfgs, vit_jax/weights/{TABLE})"
      + (f"; close names: {', '.join(close)}" if close else "")
      + ". Pass a local .npz, hf-hub:<org>/<name>, or one of the table's names."
    )
  return source
