"""Where muonbench keeps what it caches on disk (the NS plan, the quality runs' encoded corpus).

`$MUONBENCH_CACHE` when set, else the platform's user cache folder of `muonbench` (`platformdirs`: on Linux
`$XDG_CACHE_HOME/muonbench`, `~/.cache/muonbench` when XDG_CACHE_HOME is unset). No torch.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The folder muonbench caches under (not created here)."""
    import platformdirs

    override = os.environ.get("MUONBENCH_CACHE")
    return Path(override) if override else platformdirs.user_cache_path("muonbench", appauthor=False)
