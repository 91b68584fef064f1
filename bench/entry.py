"""What every command-line entry point shares: a user or config error is one line on stderr and exit 2.

`python -m bench.tools.X` and `muonbench X` both run `run(main)`, so the two spellings answer alike. No torch import.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from typing import Any, NoReturn


class ArgParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (no usage block; `--help` prints it)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def error_line(exc: BaseException) -> str:
    """The one line for a user-facing error: the message, and for a file error the file and the reason."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


def quiet_dependencies() -> None:
    """Silence dependency warnings a user cannot act on: torch imports the deprecated `pynvml` shim, which warns
    on every import (its replacement, nvidia-ml-py, is what it wraps)."""
    warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)


def run(main: Callable[[], Any]) -> int:
    """Call `main()`; ValueError (config errors included), OSError and Ctrl-C become one line and an exit code."""
    quiet_dependencies()
    try:
        return int(main() or 0)
    except SystemExit as exc:  # argparse's --help and usage errors, Hydra's exits: the same code, returned
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(f"error: {exc.code}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
