"""Names from files and folders as they may reach a terminal: escaped, one line.

A class name, a label file's line or a file name is data from anywhere: a newline in it
would start a line that looks like the command's own output (``Error: ...``, another
prediction), an escape sequence would drive the terminal, a tab would shift the columns
of a text line. `printable` writes such characters as Python escapes (``\\n``, ``\\x1b``,
``\\t``; a byte of a file name that is not UTF-8 as ``\\udcff``) and leaves every other
character, accented and non-Latin letters included, as it is.
"""

from __future__ import annotations


def printable(text: str) -> str:
  """``text`` with its non-printable characters escaped as in a Python literal."""
  if text.isprintable():
    return text
  return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
