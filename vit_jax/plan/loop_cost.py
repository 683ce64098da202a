"""XLA's cost of a compiled program with its loops multiplied out.

XLA's cost analysis counts a while loop's body once, whatever its trip count, so a
scanned encoder (``config.model.scan``: one layer's body, compiled once) or gradient
accumulation would show the FLOPs and HBM bytes of one layer or one micro-batch. Here each
loop body of the compiled HLO is parsed as a program of its own (its computation made the
entry), analysed by XLA's `HloCostAnalysis` (the CPU client's, which reads any backend's
optimized HLO), and counted trip-count times: the per-layer cost multiplied out, as
large-model planners do for scanned layers. Nested loops multiply; a loop whose trip
count cannot be read is counted once (and reported).

A conditional counts as its most expensive branch in XLA's analysis. RandAugment's
(`data.randaug.apply_rounds`: the ops under the name scope `randaug.SCOPE`, one op per
image drawn uniformly, and within it the sign's two maps, each with probability 1/2) runs
one branch per execution: it is counted at the mean of its branches, what a step costs on
average. Other conditionals keep XLA's count.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax

from vit_jax.data import randaug
from vit_jax.infra import compat
from vit_jax.plan import hlo

_HEADER = re.compile(r"^(ENTRY )?(%[^\s(]+) .*\{\s*$")
# Frame ids point into a table the text does not carry (the parser warns on each).
_STACK_FRAME = re.compile(r",? stack_frame_id=\d+")
_WHILE = re.compile(r"\bwhile\(.*\bcondition=(%[^\s,]+), body=(%[^\s,]+)")
_CONDITIONAL = re.compile(r"\bconditional\(.*\bbranch_computations=\{([^}]*)\}")
_SCOPE = re.compile(r'op_name="[^"]*/' + randaug.SCOPE + "/")


@dataclasses.dataclass(frozen=True)
class LoopCost:
  """What the loops add to the whole program's count: FLOPs and bytes of the iterations
  XLA's analysis leaves out (less what RandAugment's conditionals run below their most
  expensive branch), the loops found and those of unknown trip count."""

  extra_flops: float
  extra_bytes: float
  loops: int
  unknown_trip_counts: int


def _split(hlo_text: str) -> tuple[dict[str, list[str]], str]:
  """Each computation's lines (its header first) by name, and the entry's name."""
  comps: dict[str, list[str]] = {}
  entry, current = "", None
  for line in hlo_text.splitlines():
    match = _HEADER.match(line) if current is None else None
    if match:
      current = comps.setdefault(match.group(2), [])
      entry = match.group(2) if match.group(1) else entry
    if current is not None:
      current.append(line)
      if line.startswith("}"):
        current = None
  return comps, entry


def _as_entry(comps: dict[str, list[str]], name: str) -> str:
  """The module's text with computation ``name`` as its entry (the header's entry layout
  and schedule, which name the old entry, left out)."""
  parts = ["HloModule loop_body"]
  for comp, lines in comps.items():
    first = lines[0].removeprefix("ENTRY ")
    parts += [("ENTRY " if comp == name else "") + first, *lines[1:]]
  return "\n".join(parts)


def _cost(text: str) -> tuple[float, float]:
  """XLA's (FLOPs, bytes accessed) of an HLO module's text, loop bodies once."""
  module = compat.hlo_from_text(_STACK_FRAME.sub("", text))
  analysis = compat.cost_analysis(jax.devices("cpu")[0].client, module)
  return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


def loop_cost(hlo_text: str) -> LoopCost:
  """The FLOPs and bytes ``hlo_text``'s loops add beyond XLA's count of the program."""
  comps, entry = _split(hlo_text)
  lines = {name: body[1:] for name, body in comps.items()}
  found = unknown = 0
  cache: dict[tuple[str, bool], tuple[float, float, float, float]] = {}

  def parts(name: str, seen: tuple[str, ...], drawn: bool) -> list[tuple[str, Any, bool]]:
    """The loops ('while', body, trips) and RandAugment's conditionals ('cond', branches)
    ``name`` runs, through any calls but not inside loop bodies or branches. ``drawn``:
    ``name`` is inside one of RandAugment's branches (its conditionals are its too)."""
    result: list[tuple[str, Any, bool]] = []
    for line in lines.get(name, []):
      match = _WHILE.search(line)
      if match:
        known = hlo.KNOWN_TRIPS.search(line)
        trips = int(known.group(1)) if known else hlo.trip_count(lines.get(match.group(1), []))
        result.append(("while", (match.group(2), trips), drawn))
        continue
      match = _CONDITIONAL.search(line)
      if match and (drawn or _SCOPE.search(line)):
        branches = [b.strip() for b in match.group(1).split(",") if b.strip()]
        result.append(("cond", branches, True))
        continue
      for called in hlo.called_computations(line):
        if called in lines and called not in seen:
          result += parts(called, seen + (called,), drawn)
    return result

  def multiplied(name: str, drawn: bool = False) -> tuple[float, float, float, float]:
    """(FLOPs, bytes) of ``name`` as XLA counts it, and with its loops multiplied out and
    RandAugment's conditionals at the mean of their branches."""
    nonlocal found, unknown
    if (name, drawn) not in cache:
      flops, bytes_ = _cost(_as_entry(comps, name))
      total_flops, total_bytes = flops, bytes_
      for kind, what, inside in parts(name, (name,), drawn):
        if kind == "while":
          body, trips = what
          found += 1
          unknown += trips is None
          body_flops, body_bytes, body_total_flops, body_total_bytes = multiplied(body, inside)
          total_flops += (trips or 1) * body_total_flops - body_flops
          total_bytes += (trips or 1) * body_total_bytes - body_bytes
        else:  # XLA counted the most expensive branch; one branch runs, each as likely
          costs = [multiplied(branch, inside) for branch in what]
          total_flops += sum(c[2] for c in costs) / len(costs) - max(c[0] for c in costs)
          total_bytes += sum(c[3] for c in costs) / len(costs) - max(c[1] for c in costs)
      cache[(name, drawn)] = (flops, bytes_, total_flops, total_bytes)
    return cache[(name, drawn)]

  flops, bytes_, total_flops, total_bytes = multiplied(entry)
  return LoopCost(total_flops - flops, total_bytes - bytes_, found, unknown)
