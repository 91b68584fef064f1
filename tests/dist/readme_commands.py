"""The shell commands in README.md's code blocks (read, never run, here): see test_readme_commands.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND_HEADS = (
    "make",
    "python",
    "python3",
    ".venv/bin/python",
    "bash",
    "sh",
    "torchrun",
    "docker",
    "sbatch",
    "source",
)
"""A code-block line is a command when its first word (after `VAR=value` assignments) is one of these."""
_FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=(\$\([^)]*\)|\S+)\s+")


def _strip_comment(line: str) -> str:
    """Drop a trailing `# ...` comment (a # after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "\"'" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def head_word(line: str) -> str:
    rest = line
    while m := _ASSIGN.match(rest):
        rest = rest[m.end() :]
    return rest.split(maxsplit=1)[0] if rest.strip() else ""


def readme_commands(text: str | None = None) -> list[str]:
    """Every command line of every fenced code block of README.md, comments dropped, continuations joined."""
    text = (ROOT / "README.md").read_text() if text is None else text
    out: list[str] = []
    for block in _FENCE.findall(text):
        pending = ""
        for raw in block.splitlines():
            line = _strip_comment(raw.strip())
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            line, pending = (pending + line).strip(), ""
            if line and head_word(line) in COMMAND_HEADS:
                out.append(" ".join(line.split()))
    return list(dict.fromkeys(out))
