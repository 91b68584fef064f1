"""One timing protocol for the NS plan (`optim.kernels.plan`) and the NS benchmark (`bench.tools.ns_kernels`).

Quantity: the latency of one call started on an idle GPU. Before each timed call the host waits for the device, a
CUDA event is recorded, the call is made, a second event is recorded and waited for; the time between the events
is the call's latency, and it includes every host gap between the call's kernels (Python dispatch, Triton's
launcher, cuBLAS handle lookups) whenever the host launches slower than the GPU runs them.

Why this quantity and not back-to-back throughput: optim.Muon's fused step reads its finite screens on the host
(`optim.optimizers.fused.FusedStep.step`) right before its NS calls, one per shape group: the first starts on an idle
GPU, and a later one is hidden behind earlier GPU work only while that work outlasts the host's launches (the
per-call latency is then an upper bound). A call whose GPU work is short next to the host cost of launching its kernels
(one matrix of 1536 x 7168: ~20 launches for well under a millisecond of GEMMs) is then host-bound in the step, and a
back-to-back loop, where the host runs ahead while the previous repeat computes, would hide exactly the cost that
the step pays and that CUDA-graph replay removes. On large calls (tens of ms) the two quantities agree.

Interleaving: the functions compared are timed in rounds, one call of each per round, each round starting one
function later than the previous one (round-robin rotation), and each function's median over the rounds is
reported. A GPU at its power cap changes its clock by a few percent over seconds, and a host's launch speed drifts
too; timed one after another, the later function would carry that drift, interleaved every function sees the same
mix. A warm-up round comes first; its times are not kept (it estimates the cost of a round and brings the GPU to
its steady clock). With `keep_within`, after `min_rounds` a function is dropped when even its fastest call is slower
than (1 + keep_within) times the best median, and the remaining rounds are spent on the others. The fastest call, not
the median, decides the drop: a median of a few rounds can land on calls slowed by a clock change, and a function
dropped on it is never timed again (docs/ns_kernels_h200.md#plan-min-rounds).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

Timer = Callable[[Callable[[], object]], float]


def latency_ms(fn: Callable[[], object]) -> float:
    """ms of one call of fn started on an idle GPU (CUDA events around the call; the host waits before and after)."""
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def wall_ms(fn: Callable[[], object]) -> float:
    """ms of host wall time of one call (CPU tensors: the CPU smoke of the benchmark; no timing claims)."""
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def timer_for(device: torch.device | str) -> Timer:
    """`latency_ms` on a CUDA device, `wall_ms` otherwise."""
    return latency_ms if torch.device(device).type == "cuda" else wall_ms


def rotation(names: Sequence[str], round_index: int) -> list[str]:
    """The order of one round: `names` rotated left by round_index (round r starts with names[r mod n])."""
    if not names:
        return []
    k = round_index % len(names)
    return [*names[k:], *names[:k]]


def _rounds(names: Sequence[str], first_round: int, num_rounds: int) -> Iterator[str]:
    for r in range(first_round, first_round + num_rounds):
        yield from rotation(names, r)


def interleaved_samples(
    fns: Mapping[str, Callable[[], object]],
    *,
    timer: Timer,
    budget_ms: float,
    min_rounds: int,
    max_rounds: int,
    keep_within: float | None = None,
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """The ms of every timed call of each function over interleaved rounds (module docstring), and the error of each
    that raised.

    Args:
        fns: name -> zero-argument call, each already run once (compiled, checked).
        timer: ms of one call (`latency_ms` on CUDA).
        budget_ms: timed calls of all rounds together stop at about this much, within [min_rounds, max_rounds].
        min_rounds: rounds over every function.
        max_rounds: most rounds any function is timed.
        keep_within: after `min_rounds`, drop each function whose fastest call is slower than (1 + keep_within)
            times the best median.

    Returns:
        (samples, errors): the times of each function timed to the end or dropped by `keep_within`, in the order
        taken; errors names each function that raised while timed, with its exception (it is timed no further and
        has no samples).
    """
    if not 1 <= min_rounds <= max_rounds:
        raise ValueError(
            f"min_rounds={min_rounds}, max_rounds={max_rounds}: need 1 <= min_rounds <= max_rounds"
        )
    samples: dict[str, list[float]] = {n: [] for n in fns}
    errors: dict[str, str] = {}
    spent = 0.0

    def play(names: list[str], first_round: int, num_rounds: int, keep: bool = True) -> float:
        used = 0.0
        for name in _rounds(names, first_round, num_rounds):
            if name in errors:
                continue
            try:
                ms = timer(fns[name])
            except Exception as e:  # noqa: BLE001 - e.g. out of memory: this function is dropped, not the run
                errors[name] = f"{type(e).__name__}: {str(e)[:160]}"
                continue
            used += ms
            if keep:
                samples[name].append(ms)
        return used

    names = list(fns)
    warm = play(names, 0, 1, keep=False)  # warm-up round: the steady clock, and the cost of one round
    names = [n for n in names if n not in errors]
    rounds = max(min_rounds, min(max_rounds, int(budget_ms / max(warm, 1e-6))))
    stage1 = min_rounds if keep_within is not None else rounds
    spent += play(names, 1, stage1)
    names = [n for n in names if n not in errors]
    if keep_within is not None and names and rounds > stage1:
        med = {n: statistics.median(samples[n]) for n in names}
        best = min(med.values())
        names = [n for n in names if min(samples[n]) <= (1.0 + keep_within) * best]
        round_ms = sum(med[n] for n in names)
        extra = min(rounds - stage1, int(max(budget_ms - spent, 0.0) / max(round_ms, 1e-6)))
        play(names, 1 + stage1, extra)
    return {n: s for n, s in samples.items() if s and n not in errors}, errors


def interleaved_medians(
    fns: Mapping[str, Callable[[], object]],
    *,
    timer: Timer,
    budget_ms: float,
    min_rounds: int,
    max_rounds: int,
    keep_within: float | None = None,
) -> tuple[dict[str, float], dict[str, str]]:
    """Median ms of each function over interleaved rounds (`interleaved_samples`, same arguments), and the error of
    each that raised."""
    samples, errors = interleaved_samples(
        fns,
        timer=timer,
        budget_ms=budget_ms,
        min_rounds=min_rounds,
        max_rounds=max_rounds,
        keep_within=keep_within,
    )
    return {n: statistics.median(s) for n, s in samples.items()}, errors
