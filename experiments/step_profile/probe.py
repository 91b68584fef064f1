"""Probe `step_profile`: one step under torch.profiler, summarised per phase into `<run_dir>/profile_step<k>.json`.

`bench.probes=[step_profile]` profiles the last warm-up step (its timing is excluded from the statistics anyway,
and the profiler's overhead does not reach a timed step); `step_profile:step=K` profiles step K.
`MUONBENCH_PROFILE_TRACE=1` also writes the whole capture (`trace_step<k>.json`, chrome://tracing / Perfetto).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench import probes
from experiments.step_profile import step_profile


class Probe(probes.Probe):
    def __init__(self, step: str = "") -> None:
        self.step = int(step) if step else None

    def setup(self, engine: Any) -> None:
        self.engine = engine
        self.run_dir = Path(engine.run_dir)
        if self.step is None:
            self.step = engine.cfg.bench.warmup_steps - 1
        if not 0 <= self.step < engine.cfg.bench.steps:
            raise ValueError(
                f"step_profile step={self.step}: must be in [0, bench.steps={engine.cfg.bench.steps}) (default: "
                "the last warm-up step, which needs bench.warmup_steps >= 1)"
            )
        self.index, self.prof = -1, None

    def before_step(self) -> None:
        self.index += 1
        if self.index == self.step:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()

    def after_step(self) -> dict[str, float]:
        if self.prof is None:
            return {}
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        phases = self.engine.last_phases
        summary = step_profile.summarize(prof.events(), {k: phases[k] for k in ("fwd_bwd", "optim")})
        summary["step_s"] = phases["step"]
        step_profile.write(self.run_dir, self.index, summary)
        if os.environ.get("MUONBENCH_PROFILE_TRACE"):
            prof.export_chrome_trace(str(self.run_dir / f"trace_step{self.index}.json"))
        print(f"profiled step {self.index}:\n{step_profile.main_table(summary)}", flush=True)
        return {}
