"""Launchers: torchrun command construction, pre-launch layout and device checks, the slurm hand-off, quoting."""

from __future__ import annotations

import shlex
import sys
import types
from pathlib import Path

import pytest

import muonbench
from bench import launch, run


def _cfg(*overrides: str):
    return muonbench.load(["experiment=cpu/qwen3_moe_tiny_dp2", *overrides])


def test_local_command_is_torchrun_with_world_size_processes(tmp_path):
    """Localises a home-made process spawner or a wrong process count."""
    cmd = launch.local_command(_cfg(), tmp_path / "run 1", python="/py")
    assert cmd[:3] == ["/py", "-m", "torch.distributed.run"]
    assert "--nproc_per_node=2" in cmd and "--nnodes=1" in cmd and "--standalone" in cmd
    assert cmd[-3:] == ["-m", "bench.worker", str(tmp_path / "run 1")]
    cmd4 = launch.local_command(_cfg("parallelism=cpu_dp4"), tmp_path, python="/py")
    assert "--nproc_per_node=4" in cmd4


def test_layout_checks_fail_before_launch():
    cfg = _cfg("parallelism.nodes=2", "parallelism.gpus_per_node=1")
    with pytest.raises(ValueError, match="launcher=local runs on this machine only"):
        launch.check_layout(cfg)
    with pytest.raises(ValueError, match="nproc_per_node x nodes must equal parallelism.world_size"):
        launch.check_layout(_cfg("launcher.nproc_per_node=3"))
    launch.check_layout(_cfg())


def test_missing_gpu_is_said_plainly(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cfg = _cfg("engine.device=cuda", "engine.backend=nccl")
    with pytest.raises(ValueError, match="needs a CUDA GPU, and this machine has none"):
        launch.check_device(cfg)
    launch.check_device(_cfg())  # CPU run: nothing to check


def test_unknown_or_absent_engine_is_named(monkeypatch):
    from bench import engines

    with pytest.raises(ValueError, match=r"available: \['bridge', 'hf', 'megatron'\]"):
        engines.check_engine_present("jax")
    from muonbench.engines import ENGINES, EngineSpec, HFEngineConfig

    monkeypatch.setitem(ENGINES, "ghost", EngineSpec(config=HFEngineConfig, engine="bench.engines.ghost:GhostEngine"))
    with pytest.raises(ValueError, match="bench.engines.ghost is not in this checkout"):
        engines.check_engine_present("ghost")


def test_slurm_hands_the_worker_argv_to_write_sbatch(monkeypatch, tmp_path, capsys):
    """The sbatch text comes from bench.slurm.write_sbatch; dry_run writes and prints it without submitting."""
    seen = {}

    def write_sbatch(cfg, run_dir, command):
        seen.update(cfg=cfg, run_dir=run_dir, command=command)
        return "#!/bin/bash\nsrun torchrun " + shlex.join(command) + "\n"

    monkeypatch.setitem(sys.modules, "bench.slurm", types.SimpleNamespace(write_sbatch=write_sbatch))
    run_dir = tmp_path / "x; rm -rf ~"
    run_dir.mkdir()
    res = launch.run_slurm(_cfg("launcher=slurm", "launcher.dry_run=true"), run_dir)
    assert seen["command"] == ["-m", "bench.worker", str(run_dir)]
    assert res.submitted is False and res.returncode is None
    text = (run_dir / "job.sbatch").read_text()
    assert shlex.quote(str(run_dir)) in text and "srun torchrun" in capsys.readouterr().out


def test_shell_join_quotes_hostile_values():
    argv = ["python", "-m", "bench.worker", "runs/a b;$(touch /tmp/pwned)`x`"]
    assert shlex.split(launch.shell_join(argv)) == argv


def test_hydra_defaults_never_override_the_user():
    argv = run.with_hydra_defaults(["-m", "optimizer=adamw,muon", "hydra.sweep.dir=/tmp/s"])
    assert argv[:3] == ["-m", "optimizer=adamw,muon", "hydra.sweep.dir=/tmp/s"]
    keys = [a.split("=", 1)[0] for a in argv]
    assert keys.count("hydra.sweep.dir") == 1 and "hydra.run.dir" in keys and "hydra.sweep.subdir" in keys


def test_bench_modules_import_without_torch():
    """Launching and tabulating must work where torch cannot be imported (login node)."""
    import subprocess

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import bench.run, bench.launch, bench.engines\n"
        "import bench.results.record, bench.results.collect, bench.results.report, bench.results.regress\n"
        "print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def test_slurm_script_of_kimi_k2_matches_its_layout(tmp_path):
    """`bench.run experiment=gb300/kimi_k2_muon launcher=slurm launcher.dry_run=true` through the real
    bench.slurm writer: nodes, GPUs per node, env and the worker, checked as text; a dry run exits 0."""
    import subprocess

    cfg = muonbench.load(["experiment=gb300/kimi_k2_muon", "launcher=slurm"])
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "experiment=gb300/kimi_k2_muon",
            "launcher=slurm",
            "launcher.dry_run=true",
            f"bench.out_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    (script,) = tmp_path.rglob("job.sbatch")
    text = script.read_text()
    assert "#SBATCH --nodes=64" in text and "#SBATCH --gpus-per-node=4" in text
    assert "--nproc_per_node=4" in text and f"-m bench.worker {script.parent}" in text
    for key, value in cfg.launcher.env.items():
        assert f"export {key}={shlex.quote(str(value))}" in text
    assert "1 written" in res.stdout and text.splitlines()[0] in res.stdout


def test_cli_unknown_option_lists_the_available_ones(tmp_path):
    """`python -m bench.run optimizer=sgd` fails at compose time, before any run directory, naming the choices."""
    import subprocess

    res = subprocess.run(
        [sys.executable, "-m", "bench.run", "optimizer=sgd", f"bench.out_dir={tmp_path}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode != 0
    assert "optimizer=sgd: no such option; available: adamw, mop, muon," in res.stderr
    assert "Traceback" not in res.stderr
    assert not list(tmp_path.rglob("run.json"))


def test_timeout_kills_the_process_group_and_closes_the_record(monkeypatch, tmp_path):
    """Localises a hung run that blocks the sweep, or a timed-out run recorded as ok/error."""
    import muonbench as cfgmod
    from bench.results import record

    cfg = _cfg("bench.timeout_s=1")
    child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    monkeypatch.setattr(launch, "local_command", lambda cfg, run_dir: [sys.executable, "-c", child])
    record.write_json_atomic(
        tmp_path / "run.json",
        record.new_run_record(
            run_id="t",
            run_dir=tmp_path,
            config=cfgmod.as_dict(cfg),
            config_hash="x",
            overrides=[],
            command=["x"],
        ),
    )
    res = launch.run_local(cfg, tmp_path, echo=False)
    assert res.timed_out and res.returncode is not None and res.returncode < 0
    rec = run._close_after_launch(tmp_path, res)
    assert rec["status"] == "timeout" and rec["error"]["type"] == "Timeout"


def test_prewarm_applies_to_ours_on_megatron_cuda_local_only():
    g = ["engine=megatron", "hardware=h200", "model=qwen3_moe_tiny", "parallelism=single_gpu"]
    assert launch.needs_prewarm(muonbench.load([*g, "optimizer=muon"]))
    assert not launch.needs_prewarm(muonbench.load([*g, "optimizer=muon", "bench.prewarm=false"]))
    assert not launch.needs_prewarm(muonbench.load([*g, "optimizer=adamw"]))
    assert not launch.needs_prewarm(muonbench.load([*g, "optimizer=muon_megatron"]))
    assert not launch.needs_prewarm(muonbench.load(["optimizer=muon"]))  # hf on CPU


def test_prewarm_runs_one_untimed_step_in_a_scratch_dir(monkeypatch):
    """The prewarm launch reads the same config with one step, no warm-up, no diagnostics, and leaves nothing."""
    from bench.results import record

    cfg = muonbench.load(
        ["engine=megatron", "hardware=h200", "optimizer=muon", "bench.steps=9", "bench.probes=[gpu_energy]"]
    )
    seen = {}

    def fake_run_local(c, run_dir, *, echo=True):
        seen["cfg"] = muonbench.config_from_dict(record.read_json(run_dir / "run.json")["config"])
        seen["dir"], seen["echo"] = run_dir, echo
        return launch.LaunchResult(command=["torchrun"], returncode=0, timed_out=False, stderr_tail="")

    monkeypatch.setattr(launch, "run_local", fake_run_local)
    out = launch.prewarm_local(muonbench.as_dict(cfg), cfg)
    w = seen["cfg"]
    assert (w.bench.steps, w.bench.warmup_steps, w.bench.probes, w.bench.prewarm) == (1, 0, [], False)
    assert w.optimizer == cfg.optimizer and w.model == cfg.model and not seen["echo"]
    assert not seen["dir"].exists() and out["returncode"] == 0 and out["seconds"] >= 0


def test_prewarm_comes_before_the_timed_launch_once_per_workload(monkeypatch, tmp_path):
    """Each workload of our matrix optimizer is prewarmed once per invocation, before its first timed launch; a
    repeat of it in a crossover sweep (other bench settings, same workload) is not. Localises a timed run that
    compiles our kernels itself, or a prewarm paid again for every repeat."""
    from bench.results import record

    g = [
        "engine=megatron",
        "hardware=h200",
        "model=qwen3_moe_tiny",
        "parallelism=single_gpu",
        "optimizer=muon",
    ]
    order = []
    monkeypatch.setattr(launch, "check_device", lambda cfg: None)  # no CUDA on this machine; order is tested
    monkeypatch.setattr(launch, "prewarm_local", lambda d, cfg: order.append("prewarm") or {"returncode": 0})

    def timed(cfg, run_dir, *, echo=True):
        order.append(f"timed steps={cfg.bench.steps}")
        return launch.LaunchResult(command=["torchrun"], returncode=0, timed_out=False, stderr_tail="")

    monkeypatch.setattr(launch, "run_local", timed)
    prewarmed: set[str] = set()
    for k, steps in enumerate((4, 7)):
        run_dir = tmp_path / str(k)
        record.write_json_atomic(run_dir / "run.json", {"status": "running"})
        launch.launch(muonbench.load([*g, f"bench.steps={steps}"]), run_dir, prewarmed=prewarmed)
    assert order == ["prewarm", "timed steps=4", "timed steps=7"]
    assert record.read_json(tmp_path / "0" / "run.json")["prewarm"] == {"returncode": 0}
    assert "skipped" in record.read_json(tmp_path / "1" / "run.json")["prewarm"]
    assert prewarmed == {muonbench.config_hash(muonbench.load(g))}


FIXTURES = Path(__file__).parent / "fixtures"


def test_killed_rank_read_from_torchruns_failure_report():
    """The captured report of a 2-rank torchrun whose rank 1 got SIGKILL (rank 0 then got torchrun's SIGTERM)."""
    text = (FIXTURES / "torchrun_sigkill.stderr").read_text()
    killed = launch.killed_rank(text)
    assert killed == launch.KilledRank(rank=1, signum=9)
    assert killed.headline().startswith(
        "rank 1 was killed by SIGKILL (signal 9); a SIGKILL without a timeout"
    )
    assert "out-of-memory killer" in killed.headline()
    assert launch.killed_rank("Traceback ...\nValueError: x\n") is None


def test_signal_death_is_the_headline_not_the_peers_connection_reset(tmp_path):
    """Localises a rank killed by a signal reported as its peer's gloo "connection reset"."""
    from bench import run
    from bench.results import record

    record.write_json_atomic(
        tmp_path / "run.json", {"run_id": "r", "status": "running", "config": {}, "start_time": None}
    )
    peer = {"rank": 0, "type": "RuntimeError", "message": "Connection reset by peer", "traceback": "..."}
    record.write_json_atomic(tmp_path / "worker_error.rank0.json", peer)
    text = (FIXTURES / "torchrun_sigkill.stderr").read_text().replace("exitcode  : -15", "exitcode  : 1")
    res = launch.LaunchResult(command=["torchrun"], returncode=1, stderr_tail=text)
    rec = run._close_after_launch(tmp_path, res)
    assert rec["status"] == "killed" and rec["error"]["type"] == "killed by SIGKILL"
    assert rec["error"]["message"].startswith("rank 1 was killed by SIGKILL (signal 9)")
    assert "then rank 0: RuntimeError: Connection reset by peer" in rec["error"]["message"]
    assert run.summary_line(rec).startswith("== ")


def test_the_terminal_is_spared_import_noise_and_a_stopped_runs_last_words():
    """Console noise: the pynvml FutureWarning once per process, ~20 Apex / Transformer Engine notices, torchrun's
    SignalException traceback on Ctrl-C before the clean `interrupted` line. The log keeps all of it (the tee
    writes every byte there); the terminal's copy drops the noise lines and ends when the run is stopped."""
    import io

    from bench.launch import TerminalEcho

    term = io.BytesIO()
    echo = TerminalEcho(term)
    echo.write(b"== step 1\n/x/torch/cuda/__init__.py:61: FutureWarning: The pynvml package is deprecated. Pl")
    echo.write(b"ease install nvidia-ml-py\n  import pynvml  # type: ignore[import]\n")
    echo.write(b"/m/backends.py:34: UserWarning: Apex is not installed. Falling back to Torch Norm\n")
    echo.write(b'  warnings.warn("Apex is not installed. Falling back to Torch Norm")\n')
    echo.write(b"/m/optimizer.py:29: UserWarning: Transformer Engine and Apex are not installed. Falling back\n")
    echo.write(b"  warnings.warn(\nloss 10.4\r 50%|##   |\r100%|#####|\nlast line")
    assert term.getvalue() == b"== step 1\nloss 10.4\r 50%|##   |\r100%|#####|\n"
    echo.end()
    assert term.getvalue().endswith(b"|\nlast line")
    echo.quiet()
    echo.write(b"Traceback (most recent call last):\n...SignalException: Process 7 got signal: 15\n")
    echo.end()
    assert b"Traceback" not in term.getvalue()


def test_warnings_raised_while_building_a_launch_go_to_the_run_log(tmp_path, capsys):
    import logging
    import warnings

    from bench.launch import warnings_to

    torch_log = logging.getLogger("torch")
    before = (torch_log.handlers[:], torch_log.propagate)
    with warnings_to(tmp_path / "launch.log"):
        warnings.warn("Apex is not installed. Falling back to Torch Norm", UserWarning, stacklevel=1)
        logging.getLogger("torch.utils.cpp_extension").warning("No CUDA runtime is found")
    log = (tmp_path / "launch.log").read_text()
    assert "UserWarning: Apex is not installed" in log and "No CUDA runtime is found" in log
    err = capsys.readouterr().err
    assert "Apex" not in err and "CUDA runtime" not in err
    assert (torch_log.handlers, torch_log.propagate) == before  # restored
