"""Collectives of a compiled program: how many run per step and how many bytes they move.

Read from the compiled HLO text (`jax.stages.Compiled.as_text()`), which names every
all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute with its
per-device shape and replica groups. A collective inside a while loop (a scanned encoder,
gradient accumulation) runs once per iteration: its count is multiplied by the loop's
trip count: XLA's ``known_trip_count`` where the loop carries it (XLA:GPU), else the
bound its condition compares against.

XLA:TPU splits one collective over several fused computations (start, continuation,
done) that share its `channel_id` and groups: each is counted once. A reduce-scatter may be
lowered as an all-reduce inside a computation named `all-reduce-scatter...`: it is
counted as the reduce-scatter it is.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Optional

KINDS: tuple[str, ...] = (
  "all-reduce",
  "all-gather",
  "reduce-scatter",
  "all-to-all",
  "collective-permute",
)
# Bytes one element of each HLO element type takes.
_ELEMENT_BYTES: dict[str, float] = {
  "pred": 1,
  "s4": 0.5,
  "u4": 0.5,
  "s8": 1,
  "u8": 1,
  "f8e4m3fn": 1,
  "f8e5m2": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
  "c64": 8,
  "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY )?(%[^\s(]+) ")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?(%[^\s=]+) = ")
_CALLED = re.compile(
  r"\b(?:calls|body|branch_computations|true_computation|false_computation)=\{?([^}]*?)\}?(?:,|$)"
)
_CONDITION = re.compile(r"\bcondition=(%[^\s,]+)")
_BODY = re.compile(r"\bbody=(%[^\s,]+)")
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{([0-9,]*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{[0-9,{}]*\}")
_GROUPS = re.compile(r"replica_groups=\S+")
KNOWN_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONSTANT = re.compile(r"= [su](?:32|64)\[\][^ ]* constant\((\d+)\)")


@dataclasses.dataclass
class Collective:
  """One collective of the program: its kind, per-device bytes, group size, runs per step."""

  kind: str
  bytes: float  # one device's data: what it reduces (all-reduce, reduce-scatter), what
  #   it ends with (all-gather) or what it sends (all-to-all, collective-permute)
  group_size: int
  runs: int  # executions per step (loop trip counts multiplied)

  @property
  def traffic_bytes(self) -> float:
    """Bytes one device sends per run with ring algorithms (received: the same)."""
    n = self.group_size
    if n <= 1:
      return 0.0
    if self.kind == "all-reduce":  # a reduce-scatter then an all-gather
      return 2.0 * (n - 1) / n * self.bytes
    if self.kind == "collective-permute":
      return self.bytes
    return (n - 1) / n * self.bytes


@dataclasses.dataclass(frozen=True)
class Totals:
  """Per kind, over one step: runs, bytes (data size) and ring traffic per device."""

  runs: dict[str, int]
  bytes: dict[str, float]
  traffic_bytes: dict[str, float]
  unknown_trip_counts: int  # loops whose trip count could not be read (counted once)
  # Of all kinds, the ring traffic of collectives whose groups are larger than a node (GPU
  # nodes: they cross the network); 0 when no node size was given.
  network_traffic_bytes: float = 0.0


def _shape_bytes(shape_text: str) -> list[float]:
  """The byte size of each array in an HLO shape (a tuple gives several)."""
  sizes = []
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype in _ELEMENT_BYTES:
      count = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
      sizes.append(count * _ELEMENT_BYTES[dtype])
  return sizes


def _split_instruction(line: str) -> Optional[tuple[str, str, str, str]]:
  """(name, shape text, opcode, rest) of an instruction line; None for other lines."""
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  text = line[match.end() :]
  if text.startswith("("):  # a tuple shape: up to its closing parenthesis
    depth = 0
    for i, char in enumerate(text):
      depth += {"(": 1, ")": -1}.get(char, 0)
      if depth == 0:
        break
    shape, rest = text[: i + 1], text[i + 1 :].lstrip()
  else:
    shape, _, rest = text.partition(" ")
  opcode = rest.split("(", 1)[0].strip()
  return match.group(1), shape, opcode, rest


def computations(hlo_text: str) -> dict[str, list[str]]:
  """Computation name -> its instruction lines; the entry computation is keyed 'ENTRY'."""
  result: dict[str, list[str]] = {}
  current: Optional[list[str]] = None
  for line in hlo_text.splitlines():
    if current is None:
      match = _COMPUTATION.match(line)
      if match and line.rstrip().endswith("{"):
        current = result.setdefault("ENTRY" if line.startswith("ENTRY") else match.group(1), [])
    elif line.startswith("}"):
      current = None
    else:
      current.append(line)
  return result


def trip_count(condition: list[str]) -> Optional[int]:
  """A counted loop's bound: the one integer constant its condition compares against."""
  constants = [int(c) for line in condition for c in _CONSTANT.findall(line)]
  return constants[0] if len(constants) == 1 else None


def called_computations(line: str) -> list[str]:
  """The computations an instruction line calls (fusions, calls, branches, a loop body)."""
  return [c.strip() for m in _CALLED.finditer(line) for c in m.group(1).split(",") if c.strip()]


def _group_size(rest: str, num_devices: int) -> int:
  if match := _GROUPS_LIST.search(rest):
    return len([d for d in match.group(1).split(",") if d])
  if match := _GROUPS_IOTA.search(rest):
    return int(match.group(2))
  if match := _GROUPS_MESH.search(rest):
    sizes = dict(re.findall(r"'([^']+)'=(\d+)", match.group(1)))
    axes = re.findall(r"'([^']+)'", match.group(2))
    return math.prod(int(sizes[a]) for a in axes if a in sizes)
  return num_devices


def _data_bytes(opcode: str, shape: str, group_size: int) -> float:
  """The data a collective moves, from its result shape (operands carry no shapes).

  A combined collective has a tuple result: its arrays add up. An asynchronous start's
  result holds its operands beside its outputs. A reduce-scatter's result is 1/n of its
  input.
  """
  total = sum(_shape_bytes(shape))
  if opcode == "all-gather-start":  # (inputs, outputs): the inputs are 1/n of the outputs
    return total * group_size / (group_size + 1)
  if opcode == "collective-permute-start":  # (input, output, u32[] contexts)
    arrays = [(dtype, dims) for dtype, dims in _ARRAY.findall(shape) if dims or dtype != "u32"]
    return sum(_shape_bytes(" ".join(f"{t}[{d}]" for t, d in arrays))) / 2
  if opcode.removesuffix("-start") == "reduce-scatter":
    return total * group_size
  return total


def _kind(opcode: str, computation: str) -> Optional[str]:
  base = opcode.removesuffix("-start")
  if base not in KINDS:
    return None
  if base == "all-reduce" and computation.startswith("%all-reduce-scatter"):
    return "reduce-scatter"
  return base


def collectives(hlo_text: str, num_devices: int) -> tuple[list[Collective], int]:
  """Every collective reachable from the entry computation, and the unknown trip counts."""
  comps = computations(hlo_text)
  found: dict[str, Collective] = {}
  unknown = 0

  def walk(name: str, runs: int, stack: tuple[str, ...]) -> None:
    nonlocal unknown
    for line in comps.get(name, []):
      parsed = _split_instruction(line)
      if parsed is None:
        continue
      inst, shape, opcode, rest = parsed
      if opcode.endswith("-done") or opcode == "async-done":
        continue  # the start of the same operation was counted
      kind = _kind(opcode, name)
      if kind is not None:
        n = _group_size(rest, num_devices)
        channel = _CHANNEL.search(rest)
        # The parts of one collective share its channel and its groups; JAX gives a scan's
        # ppermute and its transpose one channel, with the pairs reversed.
        groups = _PAIRS.search(rest) or _GROUPS.search(rest)
        where = f"{kind} {groups.group(0) if groups else ''}"
        key = f"channel {channel.group(1)} {where}" if channel else f"{name}/{inst}"
        previous = found.get(key)
        if previous is None or previous.runs < runs:
          found[key] = Collective(kind, _data_bytes(opcode, shape, n), n, runs)
      callees: list[tuple[str, int]] = []
      if opcode == "while":
        body, condition = _BODY.search(rest), _CONDITION.search(rest)
        known = KNOWN_TRIPS.search(rest)  # XLA's own analysis (XLA:GPU writes it)
        trips = int(known.group(1)) if known else None
        if trips is None and condition:
          trips = trip_count(comps.get(condition.group(1), []))
        if trips is None:
          unknown += 1
        callees.append((body.group(1) if body else "", runs * (trips or 1)))
      else:
        for match in _CALLED.finditer(rest):
          callees += [(c.strip(), runs) for c in match.group(1).split(",") if c.strip()]
      for callee, callee_runs in callees:
        if callee in comps and callee not in stack:
          walk(callee, callee_runs, stack + (callee,))

  walk("ENTRY", 1, ("ENTRY",))
  return list(found.values()), unknown


def totals(hlo_text: str, num_devices: int, node_size: Optional[int] = None) -> Totals:
  """Runs, bytes and ring traffic per collective kind over one execution of the program.

  ``node_size``: devices per node where nodes are joined by a slower network (GPUs). A
  group of more devices must cross it; smaller groups are taken to be within a node, as
  the mesh puts them (`sharding.make_mesh` orders the devices node by node, the 'model'
  axis innermost).
  """
  found, unknown = collectives(hlo_text, num_devices)
  runs: dict[str, int] = collections.Counter()
  size: dict[str, float] = collections.defaultdict(float)
  traffic: dict[str, float] = collections.defaultdict(float)
  for c in found:
    runs[c.kind] += c.runs
    size[c.kind] += c.bytes * c.runs
    traffic[c.kind] += c.traffic_bytes * c.runs
  crossing = [c for c in found if node_size and c.group_size > node_size]
  return Totals(
    runs={k: runs.get(k, 0) for k in KINDS},
    bytes={k: size.get(k, 0.0) for k in KINDS},
    traffic_bytes={k: traffic.get(k, 0.0) for k in KINDS},
    unknown_trip_counts=unknown,
    network_traffic_bytes=sum(c.traffic_bytes * c.runs for c in crossing),
  )
