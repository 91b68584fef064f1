"""The NeMo-Run `Packager` of a cluster job (`bench.cluster`): our packages into the job's `code` folder.

NeMo-Run mounts that folder as the container's working directory (`/nemo_run/code`), so the job imports our code from
the run's own copy (`bench.slurm.copy_code`) and everything else from the image. A module of its own because it
imports `nemo_run` at the top (the `nemo-run` extra), and NeMo-Run finds the class by its module when it reads an
experiment back (`muonbench cluster status`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nemo_run.core.packaging.base import Packager

from bench import slurm


@dataclass(kw_only=True)
class CodePackager(Packager):
    """Copies `bench.slurm.CODE_PACKAGES` into `<job_dir>/code`; nothing for NeMo-Run to extract."""

    def package(self, path: Path, job_dir: str, name: str) -> str:
        slurm.copy_code(Path(job_dir) / slurm.CODE_DIR)
        return ""
