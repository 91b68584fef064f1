"""Launchers: `local` runs torchrun on this machine; `slurm` writes an sbatch script (srun + torchrun) and submits it.

Both start the same worker, `python -m bench.worker <run_dir>`, which reads its config from `<run_dir>/run.json`.
Process start-up, rendezvous and killing the other ranks when one fails are torchrun's job; nothing here re-does it.
No value reaches a shell unquoted: the local launcher passes an argv list (no shell), the sbatch text is built by
`bench.slurm.write_sbatch`, which quotes with `shlex.quote`.

No torch import at module top (a login node launches without torch); the GPU check imports it lazily.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench import cluster, memory, nvsmi
from bench.results.record import STDERR_TAIL_CHARS
from muonbench import engines
from muonbench.compose import config_from_dict
from muonbench.schema import RootConfig
from optim import registry

WORKER_MODULE = "bench.worker"


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchResult:
    """How the launched job ended (for `local`; a submitted Slurm job has returncode None)."""

    command: list[str]
    returncode: int | None
    timed_out: bool = False
    stderr_tail: str = ""
    submitted: bool = False
    log_errors: tuple[str, ...] = ()
    """Writes of the child's output to `<run_dir>/*.log` that failed (a full disk), each naming the file."""


def worker_argv(run_dir: str | Path) -> list[str]:
    """The module invocation every launcher runs under torchrun: `-m bench.worker <run_dir>`."""
    return ["-m", WORKER_MODULE, str(run_dir)]


def nproc_per_node(cfg: RootConfig) -> int:
    """Processes per node: launcher.nproc_per_node, else parallelism.gpus_per_node."""
    return cfg.launcher.nproc_per_node or cfg.parallelism.gpus_per_node


def num_nodes(cfg: RootConfig) -> int:
    return cfg.launcher.nodes or cfg.parallelism.nodes


def check_layout(cfg: RootConfig) -> None:
    """Launcher rules (before anything starts): processes x nodes must equal world_size; local is one node."""
    nproc, nodes = nproc_per_node(cfg), num_nodes(cfg)
    if nproc * nodes != cfg.parallelism.world_size:
        raise ValueError(
            f"launcher.nproc_per_node={nproc}: nproc_per_node x nodes must equal parallelism.world_size "
            f"({nproc} x {nodes} != {cfg.parallelism.world_size})"
        )
    if cfg.launcher.name == "local" and nodes != 1:
        raise ValueError(
            f"parallelism.nodes={nodes}: launcher=local runs on this machine only; use launcher=slurm for several nodes"
        )


def check_device(cfg: RootConfig) -> None:
    """A CUDA run needs enough CUDA GPUs here (local launcher only; a Slurm job checks on its nodes)."""
    if cfg.launcher.name != "local" or cfg.engine.device != "cuda":
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need = nproc_per_node(cfg)
    if have == 0:
        raise ValueError(
            f"engine.name={cfg.engine.name!r} with engine.device=cuda needs a CUDA GPU, and this machine has none "
            "(torch.cuda.device_count() = 0). Run it on a GPU machine, or use engine=hf engine.device=cpu."
        )
    if have < need:
        raise ValueError(
            f"launcher=local needs {need} GPUs on this machine (nproc_per_node) but it has {have}"
        )
    gpus = local_gpus()[:need]
    if gpus:  # the GPU this run will use, before any model is built: group and free memory
        name, free = min(gpus, key=lambda g: g[1])
        memory.check_gpu(cfg, name, free)


def local_gpus() -> list[tuple[str, float]]:
    """(name, free bytes) of each GPU here, from nvidia-smi (no CUDA context in the launcher); [] without it."""
    out = []
    for row in nvsmi.query(("name", "memory.free"), units=False):
        try:
            out.append((",".join(row[:-1]), float(row[-1]) * 2**20))  # MiB
        except (ValueError, IndexError):
            continue
    return out


def local_command(cfg: RootConfig, run_dir: str | Path, *, python: str | None = None) -> list[str]:
    """`python -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=N -m bench.worker <run_dir>`."""
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc_per_node={nproc_per_node(cfg)}",
        *worker_argv(run_dir),
    ]


NOISE = (
    re.compile(rb"FutureWarning: The pynvml package is deprecated"),
    re.compile(rb"UserWarning: (Transformer Engine and )?Apex (is|are) not installed"),
    re.compile(rb"UserWarning: Only transformer-engine>=[0-9.]+ supports"),
    re.compile(rb"cpp_extension\.py:[0-9]+\] No CUDA runtime is found"),
)
"""Lines the terminal is spared (they stay in the run's log): warnings every import of torch or Megatron prints
without this project's doing anything about them; the indented source line after a warning goes with it."""


class TerminalEcho:
    """The terminal's copy of a child's stream: line by line without the `NOISE` lines, a progress bar's carriage
    returns passed at once; `quiet()` (the run is being stopped) ends the echo, so a dying torchrun's traceback
    lands in the log only, not before the clean `interrupted` line."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink, self.buf, self.muted, self.after_noise = sink, b"", False, False

    def write(self, chunk: bytes) -> None:
        if self.muted:
            return
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            if any(p.search(line) for p in NOISE):
                self.after_noise = True
            elif not (self.after_noise and line.startswith(b"  ")):
                self.after_noise = False
                self.sink.write(line + b"\n")
        if b"\r" in self.buf:
            self.sink.write(self.buf)
            self.buf = b""

    def flush(self) -> None:
        self.sink.flush()

    def quiet(self) -> None:
        self.muted = True

    def end(self) -> None:
        """The stream ended: its last line, if it had no newline."""
        if self.buf and not self.muted:
            self.sink.write(self.buf)
            self.sink.flush()
        self.buf = b""


@contextlib.contextmanager
def warnings_to(log_path: Path) -> Iterator[None]:
    """Python warnings and torch's log lines raised in this process meanwhile (importing Megatron to build a
    launch: ~20 Apex / Transformer Engine notices on a host without them) go to `log_path`, not the terminal."""
    import logging

    with open(log_path, "a") as log, warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: log.write(
            warnings.formatwarning(m, c, f, n, line)
        )
        with contextlib.suppress(ImportError):
            import torch._logging  # noqa: F401 - torch sets its log handlers on import: first that, then the swap
        handler = logging.StreamHandler(log)
        torch_log = logging.getLogger("torch")
        saved = torch_log.handlers[:], torch_log.propagate
        torch_log.handlers, torch_log.propagate = [handler], False
        try:
            yield
        finally:
            torch_log.handlers, torch_log.propagate = saved


class Tail:
    """The last `n` bytes of a stream, kept in memory (the stderr tail of a run whose log file could not be
    written)."""

    def __init__(self, n: int = STDERR_TAIL_CHARS) -> None:
        self.n, self.data = n, b""

    def write(self, chunk: bytes) -> None:
        self.data = (self.data + chunk)[-self.n :]

    def flush(self) -> None:
        pass


def _tee(src: IO[bytes], sinks: list[Any], failures: list[str]) -> None:
    """Copy a child's stream to the terminal and a log file as it arrives (keeps progress-bar carriage returns).
    A sink whose write fails (a full disk) is dropped and named in `failures`; the stream is still drained, since a
    child blocked on a full pipe would hang the run."""
    live = list(sinks)
    for chunk in iter(lambda: src.read1(4096), b""):
        for sink in list(live):
            try:
                sink.write(chunk)
                sink.flush()
            except OSError as exc:
                live.remove(sink)
                failures.append(f"{getattr(sink, 'name', type(sink).__name__)}: {exc}")
    for sink in live:
        if isinstance(sink, TerminalEcho):
            sink.end()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when bench.run dies (`kill -9` too), so torchrun and its workers do not
    outlive the invocation that records them (Linux prctl PR_SET_PDEATHSIG; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def run_local(cfg: RootConfig, run_dir: str | Path, *, echo: bool = True) -> LaunchResult:
    """Run torchrun in its own process group; kill the group after `bench.timeout_s`. Logs go to `<run_dir>/*.log`."""
    run_dir = Path(run_dir)
    cmd = local_command(cfg, run_dir)
    env = {**os.environ, **{str(k): str(v) for k, v in cfg.launcher.env.items()}}
    env.setdefault("OMP_NUM_THREADS", "1")
    # unbuffered: a log write that fails (a full disk) fails at once in `_tee`, not again when the file is closed
    with open(run_dir / "stdout.log", "wb", buffering=0) as out_log, open(
        run_dir / "stderr.log", "wb", buffering=0
    ) as err_log:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, before exec; no locks taken
        )
        assert proc.stdout is not None and proc.stderr is not None
        echoes = [TerminalEcho(sys.stdout.buffer), TerminalEcho(sys.stderr.buffer)] if echo else []
        term_out, term_err = echoes[:1], echoes[1:]
        err_tail, failures = Tail(), []
        streams = ((proc.stdout, [out_log, *term_out]), (proc.stderr, [err_log, *term_err, err_tail]))
        threads = [threading.Thread(target=_tee, args=(*st, failures), daemon=True) for st in streams]
        for t in threads:
            t.start()
        timed_out = False
        try:
            proc.wait(timeout=cfg.bench.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:
            for e in echoes:
                e.quiet()  # what the stopped processes print goes to the logs only
            _kill_group(proc)
            raise
        finally:
            for t in threads:
                t.join(timeout=10)
    return LaunchResult(
        command=cmd,
        returncode=proc.returncode,
        timed_out=timed_out,
        stderr_tail=err_tail.data.decode(errors="replace"),
        log_errors=tuple(failures),
    )


PREWARM_BENCH: dict[str, Any] = {
    "steps": 1,
    "warmup_steps": 0,
    "progress": False,
    "probes": [],
    "prewarm": False,
}
"""The bench settings of a prewarm launch: one untimed step, no probes."""


def runs_our_kernels(cfg: RootConfig) -> bool:
    """Our implementation of a matrix optimizer (Triton kernels, NS plan), not AdamW or Megatron's built-in."""
    return registry.spec(cfg.optimizer.name).matrix and cfg.optimizer.implementation == "ours"


def needs_prewarm(cfg: RootConfig) -> bool:
    """`bench.prewarm` applies: megatron engine on CUDA, our implementation of a matrix optimizer, local launcher."""
    return (
        cfg.bench.prewarm
        and cfg.launcher.name == "local"
        and engines.spec(cfg.engine.name).prewarm
        and cfg.engine.device == "cuda"
        and runs_our_kernels(cfg)
    )


def prewarm_local(cfg_dict: dict[str, Any], cfg: RootConfig) -> dict[str, Any]:
    """One untimed step of this run's launch in a scratch directory (deleted afterwards), so our Triton kernels and
    the NS plan are on disk before the timed processes start. Returns what happened, for run.json."""
    from bench.results import record

    scratch = Path(tempfile.mkdtemp(prefix="muonbench_prewarm_"))
    warm_dict = {**cfg_dict, "bench": {**cfg_dict["bench"], **PREWARM_BENCH}}
    t0 = time.perf_counter()
    try:
        record.write_json_atomic(scratch / "run.json", {"schema": record.RUN_SCHEMA, "config": warm_dict})
        res = run_local(config_from_dict(warm_dict), scratch, echo=False)
        out = {"returncode": res.returncode, "timed_out": res.timed_out}
        if res.returncode != 0:
            out["stderr_tail"] = res.stderr_tail[-1000:]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out | {"seconds": round(time.perf_counter() - t0, 1)}


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the torchrun process group we started, then SIGKILL after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run_slurm(cfg: RootConfig, run_dir: str | Path) -> LaunchResult:
    """Write `<run_dir>/job.sbatch` (text from `bench.slurm.write_sbatch`); submit unless dry_run or no sbatch.
    A job sbatch refuses is a ValueError with sbatch's own message (the run's record is closed `error`)."""
    from bench.slurm import write_sbatch

    run_dir = Path(run_dir)
    text = write_sbatch(cfg, run_dir, worker_argv(run_dir))
    script = run_dir / "job.sbatch"
    script.write_text(text)
    sbatch = shutil.which("sbatch")
    if cfg.launcher.dry_run or sbatch is None:
        print(text)
        why = "launcher.dry_run=true" if cfg.launcher.dry_run else "no sbatch on PATH"
        print(f"# not submitted ({why}); script: {script}", file=sys.stderr)
        return LaunchResult(command=["sbatch", str(script)], returncode=None, submitted=False)
    res = subprocess.run([sbatch, str(script)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        said = "; ".join(line for line in (res.stderr or res.stdout).splitlines() if line.strip())
        raise ValueError(f"sbatch failed (exit {res.returncode}): {said}")
    print(res.stdout.strip())
    return LaunchResult(command=[sbatch, str(script)], returncode=0, submitted=True)


def check_launchable(cfg: RootConfig) -> None:
    """The layout, the engine, the device (local launcher) or every value of the job script (slurm): checked for
    every job before any run directory is written, and again by `launch`."""
    from bench.engines import check_engine_present

    check_layout(cfg)
    check_engine_present(cfg.engine.name)
    if cfg.launcher.name == "local":
        check_device(cfg)
    else:  # every value the job script takes, with the run directories' root for the run directory
        from bench.slurm import check_job

        check_job(cfg, Path(cfg.bench.out_dir).resolve())
    memory.check(cfg)


def run_nemo_run(cfg: RootConfig, run_dir: Path) -> LaunchResult:
    """launcher.via=nemo_run: the run as a NeMo-Run experiment (`bench.cluster`); a Slurm one is submitted (or
    printed: launcher.dry_run), a local one runs here and waits."""
    exp_id, rc = cluster.launch_run(cfg, run_dir, nproc=nproc_per_node(cfg), nodes=num_nodes(cfg))
    command = ["nemo_run", "experiment", exp_id or "(dry run)"]
    if cfg.launcher.name == "local" and exp_id is not None:
        return LaunchResult(command=command, returncode=rc)
    return LaunchResult(command=command, returncode=None, submitted=exp_id is not None)


def launch(cfg: RootConfig, run_dir: str | Path, *, prewarmed: set[str] | None = None) -> LaunchResult:
    """Check the layout, the engine and the device, then start the run with the configured launcher.

    `prewarmed`: config hashes (`muonbench.config_hash`, the workload without the bench settings) already prewarmed by
    this invocation; a job of such a workload skips its prewarm (the caches are on disk), a prewarmed one is added."""
    with warnings_to(Path(run_dir) / "launch.log"):  # the device check imports torch
        check_launchable(cfg)
    if cfg.launcher.via == "nemo_run":
        with warnings_to(Path(run_dir) / "launch.log"):
            return run_nemo_run(cfg, Path(run_dir))
    match cfg.launcher.name:
        case "local":
            if needs_prewarm(cfg):
                import muonbench
                from bench.results import record

                key = muonbench.config_hash(cfg)
                if prewarmed is not None and key in prewarmed:
                    warm: dict[str, Any] = {
                        "skipped": "this workload was prewarmed earlier in this invocation"
                    }
                else:
                    print(
                        "== prewarm: one untimed step (kernels compiled, NS plan measured)", file=sys.stderr
                    )
                    warm = prewarm_local(muonbench.as_dict(cfg), cfg)
                    if prewarmed is not None:
                        prewarmed.add(key)
                record.update_run_json(run_dir, prewarm=warm)
            return run_local(cfg, run_dir)
        case "slurm":
            with warnings_to(Path(run_dir) / "launch.log"):
                return run_slurm(cfg, run_dir)
        case other:
            raise ValueError(f"launcher.name={other!r}: allowed ['local', 'slurm']")


TORCHRUN_PATTERNS: dict[str, re.Pattern[str]] = {
    "rank": re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank"),
    "exitcode": re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid"),
    "root_cause": re.compile(r"^Root Cause"),
}
"""The lines of torchrun's failure report (torch.distributed.elastic `ChildFailedError`) read here: each failed
rank's block names its rank, then its exit code (negative: killed by that signal). Tested on a captured log."""


@dataclass(frozen=True, kw_only=True, slots=True)
class KilledRank:
    rank: int
    signum: int

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    def headline(self) -> str:
        """One line naming the rank and the signal (and the likely sender of a SIGKILL)."""
        text = f"rank {self.rank} was killed by {self.signal_name} (signal {self.signum})"
        if self.signum == signal.SIGKILL:
            text += "; a SIGKILL without a timeout usually comes from the kernel's out-of-memory killer (see dmesg)"
        return text


def killed_rank(stderr: str, *, ranks_with_errors: frozenset[int] = frozenset()) -> KilledRank | None:
    """The rank a signal killed, from torchrun's failure report in `stderr`: a rank that died by a signal other than
    the SIGTERM torchrun sends to the survivors and wrote no error of its own, else the root cause if a signal killed
    it; None when no rank died by a signal."""
    killed: list[tuple[int, int, bool]] = []  # (rank, signum, is the root cause)
    rank, root = None, False
    for line in stderr.splitlines():
        if TORCHRUN_PATTERNS["root_cause"].match(line):
            root = True
        elif m := TORCHRUN_PATTERNS["rank"].match(line):
            rank = int(m.group(1))
        elif (m := TORCHRUN_PATTERNS["exitcode"].match(line)) and rank is not None:
            code = int(m.group(1))
            if code < 0:
                killed.append((rank, -code, root))
            rank = None
    for r, signum, _ in killed:
        if signum != signal.SIGTERM and r not in ranks_with_errors:
            return KilledRank(rank=r, signum=signum)
    for r, signum, is_root in killed:
        if is_root:
            return KilledRank(rank=r, signum=signum)
    return None


def shell_join(argv: list[str]) -> str:
    """A command line for logs and reports, quoted so it can be pasted into a shell safely."""
    return shlex.join(argv)
