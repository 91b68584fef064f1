"""The one Markdown table writer of the reports: pandas' `DataFrame.to_markdown` (tabulate's pipe format)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A pipe table of `rows` under `header`; cells written as given (no number parsing, so '1.50' stays)."""
    import pandas as pd

    frame = pd.DataFrame([[str(c) for c in r] for r in rows], columns=list(header))
    return frame.to_markdown(index=False, tablefmt="pipe", disable_numparse=True)
