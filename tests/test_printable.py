"""Names escaped for a terminal: control characters as Python escapes, letters kept."""

import pytest

from vit_jax.infra.printable import printable


@pytest.mark.parametrize(
  "text, shown",
  [
    ("golden retriever", "golden retriever"),
    ("café, 猫", "café, 猫"),  # letters of any script stay
    ("a\nError: forged", "a\\nError: forged"),
    ("x\x1b[2Jy", "x\\x1b[2Jy"),
    ("tab\there", "tab\\there"),
    ("cr\rlf", "cr\\rlf"),
    ("next\x85line", "next\\x85line"),
    ("bad byte \udcff", "bad byte \\udcff"),  # a non-UTF-8 file name (surrogateescape)
  ],
)
def test_printable_escapes_what_could_forge_a_line_or_drive_a_terminal(text, shown):
  assert printable(text) == shown
  assert "\n" not in printable(text) and printable(text).isprintable()
