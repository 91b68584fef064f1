"""bench.sweep and bench.run's front: checking every job before any starts, unique run directories, the manifest,
resume plans, and `--help` of every entry point."""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench import sweep
from bench.results import record


def test_expand_gives_hydras_jobs_in_order():
    jobs = sweep.expand(["-m", "optimizer=adamw,muon", "optimizer.lr=0.1,0.2", "bench.steps=3"])
    assert jobs == [
        ["optimizer=adamw", "optimizer.lr=0.1", "bench.steps=3"],
        ["optimizer=adamw", "optimizer.lr=0.2", "bench.steps=3"],
        ["optimizer=muon", "optimizer.lr=0.1", "bench.steps=3"],
        ["optimizer=muon", "optimizer.lr=0.2", "bench.steps=3"],
    ]
    assert sweep.expand(["optimizer=muon"]) == [["optimizer=muon"]]


def test_preflight_names_each_bad_job():
    errors = sweep.preflight(sweep.expand(["-m", "optimizer.lr=0.1,-1", "parallelism.tp=1,2"]))
    tp_rule = "the hf engine is data parallel only (allowed: 1); use engine=megatron for model parallelism"
    assert errors == [
        f"parallelism.tp=2: {tp_rule}  [job: optimizer.lr=0.1 parallelism.tp=2]",
        (
            "optimizer.lr=-1.0: is not in [0.0, inf]  "
            "[jobs: optimizer.lr=-1 parallelism.tp=1; optimizer.lr=-1 parallelism.tp=2]"
        ),
    ]  # one line per distinct error, not one per job


def test_bad_input_is_refused_before_launch_without_traceback_or_run_dir(tmp_path):
    """Localises bad values caught only after torchrun started (a traceback per rank, a run directory left)."""
    res = subprocess.run(
        [sys.executable, "-m", "bench.run", "-m", "optimizer=adamw,muon", "optimizer.momentum=1.5",
         f"bench.out_dir={tmp_path / 'runs'}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 2
    out = f"bench.out_dir={tmp_path / 'runs'}"
    fields = (
        "adam_beta1, adam_beta2, adam_eps, clip_grad, implementation, lr, lr_decay, lr_warmup_steps, min_lr"
    )
    assert res.stderr.splitlines() == [
        (
            f"error: optimizer.momentum: no such field in AdamWSchema; its fields: {fields}, name, weight_decay  "
            f"[job: optimizer=adamw optimizer.momentum=1.5 {out}]"
        ),
        f"error: optimizer.momentum=1.5: is not in [0.0, 1.0)  [job: optimizer=muon optimizer.momentum=1.5 {out}]",
    ]
    assert not (tmp_path / "runs").exists()


def test_claim_run_dir_is_exclusive(tmp_path):
    """Localises two bench.run started in the same second sharing one run directory."""
    target = tmp_path / "20260101_000000_tiny_muon"
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(sweep.claim_run_dir(target))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 6 and target in got
    assert sorted(p.name for p in got if p != target) == [f"{target.name}.{k}" for k in range(2, 7)]


def test_manifest_is_current_from_the_first_job(tmp_path):
    m = sweep.Manifest(out_dir=tmp_path, argv=["-m", "optimizer=adamw,muon"])
    m.write()
    latest = record.read_json(tmp_path / "LATEST.json")
    assert latest["state"] == "running" and latest["runs"] == [] and latest["invocation"] == m.invocation
    m.sweep_dir = str(tmp_path / "sweep")
    m.note(tmp_path / "sweep" / "0_adamw", "running", "name")
    m.note(tmp_path / "sweep" / "0_adamw", "ok")
    m.finish("interrupted")
    for path in (tmp_path / "LATEST.json", tmp_path / "sweep" / "sweep.json"):
        data = record.read_json(path)
        assert data["state"] == "interrupted" and data["statuses"] == {
            str(tmp_path / "sweep" / "0_adamw"): "ok"
        }
        assert data["report_name"] == "name"


def _run(path, status, overrides):
    record.write_json_atomic(path / "run.json", {"status": status, "overrides": overrides})
    return str(path)


def test_resume_plan_skips_only_runs_that_did_not_fail(tmp_path):
    argv = ["-m", "optimizer=adamw,muon,mop", "bench.steps=3"]
    runs = [
        _run(tmp_path / "0", "ok", ["optimizer=adamw", "bench.steps=3"]),
        _run(tmp_path / "1", "interrupted", ["optimizer=muon", "bench.steps=3"]),
    ]
    gone = str(tmp_path / "2")  # listed, its run.json deleted: rerun
    record.write_json_atomic(
        tmp_path / "sweep.json", {"argv": [*argv, "bench.resume=old"], "runs": [*runs, gone]}
    )
    recorded, done = sweep.resume_plan(str(tmp_path))
    assert recorded == argv
    assert done == {("optimizer=adamw", "bench.steps=3"): [tmp_path / "0"]}
    assert sweep.job_key(["optimizer=adamw", "bench.steps=3", "bench.resume=x"]) in done
    with pytest.raises(ValueError, match="no manifest there"):
        sweep.resume_plan(str(tmp_path / "nothing"))


def test_resume_plan_keeps_each_ok_run_of_a_repeated_job(tmp_path):
    """A crossover sweep repeats jobs (`optimizer=adamw,muon,muon,adamw`): localises a resume that skips both runs
    of a repeated job when only one of them ended ok."""
    argv = ["-m", "optimizer=adamw,muon,muon,adamw"]
    runs = [
        _run(tmp_path / "0", "ok", ["optimizer=adamw"]),
        _run(tmp_path / "1", "ok", ["optimizer=muon"]),
        _run(tmp_path / "2", "ok", ["optimizer=muon"]),
        _run(tmp_path / "3", "skipped", ["optimizer=adamw"]),
    ]
    record.write_json_atomic(tmp_path / "sweep.json", {"argv": argv, "runs": runs})
    _, done = sweep.resume_plan(str(tmp_path))
    assert done == {
        ("optimizer=adamw",): [tmp_path / "0"],
        ("optimizer=muon",): [tmp_path / "1", tmp_path / "2"],
    }


def test_sweep_goes_on_after_a_failed_job_and_records_budget_skips(tmp_path):
    """One invocation, a crossover order with repeated values: each job gets its own run directory; the first
    job is killed by bench.timeout_s (a failure that must not stop the sweep), and the jobs whose turn comes after
    bench.budget_s are recorded `skipped`, not dropped. Localises a second runner's budget and keep-going rules
    lost in bench.run.

    The second job starts after the first's timeout, so any budget below it skips the rest; the budget only has
    to cover bench.run composing the first job, which a loaded 2-core machine stretched past 4 s: 8 s of 10.
    One rank: the ranks are not the point, and the job keeps its rank busy until the timeout."""
    out = tmp_path / "runs"
    res = subprocess.run(
        [sys.executable, "-m", "bench.run", "-m", "optimizer=adamw,muon,muon,adamw", "bench.steps=100000",
         "bench.warmup_steps=1", "bench.timeout_s=10", "bench.budget_s=8", "parallelism.world_size=1",
         "parallelism.gpus_per_node=1", "parallelism.gbs=2", f"bench.out_dir={out}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-2000:]
    manifest = record.read_json(out / "LATEST.json")
    assert manifest["state"] == "complete"
    dirs = [Path(d) for d in manifest["runs"]]
    assert [d.name for d in dirs] == ["0_adamw", "1_muon", "2_muon", "3_adamw"]
    recs = [record.read_json(d / "run.json") for d in dirs]
    assert [r["status"] for r in recs] == ["timeout", "skipped", "skipped", "skipped"]
    assert [r["choices"]["optimizer"] for r in recs] == ["adamw", "muon", "muon", "adamw"]
    assert recs[1]["error"]["message"].startswith("not started: bench.budget_s=8 s spent")
    assert "[muon] skipped: Skipped: not started: bench.budget_s=8 s spent" in res.stdout


HYDRA_STYLE = ["bench.tools.flops", "bench.tools.balance", "bench.tools.project", "recipes.__main__"]
KEY_VALUE = [
    "bench.tools.quality.sweep",
    "bench.tools.ns_kernels",
    "experiments.ns_tiles.ns_tiles",
    "bench.tools.optim_scaling",
    "bench.tools.optim_step",
]
ARGPARSE = ["bench.results.collect", "bench.results.report", "bench.results.regress"]


@pytest.mark.parametrize("module", HYDRA_STYLE + KEY_VALUE + ["bench.slurm"])
def test_every_entry_point_answers_help(module, capsys):
    """Localises `--help` answered by a Hydra parse traceback or a key=value error."""
    main = importlib.import_module(module).main
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage" in out.lower() or "python -m" in out
    if module in HYDRA_STYLE:
        assert "config groups" in out and "optimizer    adamw, mop, muon, muon_megatron" in out
        assert "bench.{steps=10" in out


@pytest.mark.parametrize("module", ARGPARSE)
def test_argparse_entry_points_answer_help(module, capsys):
    with pytest.raises(SystemExit) as info:
        importlib.import_module(module).main(["--help"])
    assert info.value.code == 0 and "usage: python -m" in capsys.readouterr().out


def test_bench_run_help_is_ours_not_hydras():
    res = subprocess.run(
        [sys.executable, "-m", "bench.run", "--help"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0 and res.stdout.startswith("usage: python -m bench.run")
    assert "experiment   cpu/hf_tiny_dp2, cpu/qwen3_moe_tiny_dp2, gb300/kimi_k2_adamw" in res.stdout
    assert "bench.resume=PATH" in res.stdout and "Powered by Hydra" not in res.stdout


def test_inspection_flags_after_the_overrides_are_hydras_not_an_argparse_error():
    """`bench.run <overrides> --cfg job` printed an argparse error (Hydra takes no override after a flag)."""
    from bench.run import flags_first

    assert flags_first(["experiment=x", "--cfg", "job", "a=1"]) == ["--cfg", "job", "experiment=x", "a=1"]
    assert flags_first(["a=1", "--info", "b=2"]) == ["a=1", "b=2", "--info"]  # a bare --info takes no override
    assert flags_first(["a=1", "-i", "defaults", "--resolve"]) == ["-i", "defaults", "--resolve", "a=1"]
    res = subprocess.run(
        [sys.executable, "-m", "bench.run", "experiment=cpu/qwen3_moe_tiny_dp2", "model.num_layers=3", "--cfg", "job"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "num_layers: 3" in res.stdout and "error" not in res.stderr


def _read_only_dir(tmp_path: Path) -> Path:
    """A directory this process cannot create files in: chmod for a user, a kernel directory for root."""
    import os

    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    kernel = Path("/sys/kernel")
    try:
        (kernel / "muonbench_probe").touch()
    except OSError:
        return kernel
    pytest.skip("no directory here that root cannot write")


def test_an_output_directory_that_cannot_be_written_is_one_line_before_launch(tmp_path):
    """An output path that is a file, lies under a file, or is read-only: raw tracebacks (exit 1) from deep in
    the launch; now one line naming bench.out_dir from the preflight (bench.run prints it and exits 2), nothing
    created."""
    (tmp_path / "f").write_text("")
    ro = _read_only_dir(tmp_path)
    cases = {
        str(tmp_path / "f"): f"bench.out_dir={tmp_path / 'f'}: is a file; give a directory",
        str(tmp_path / "f" / "runs"): f"bench.out_dir={tmp_path / 'f' / 'runs'}: lies under a file ({tmp_path / 'f'})",
        str(ro / "runs"): f"bench.out_dir={ro / 'runs'}: cannot write in {ro} (",
    }
    for out, message in cases.items():
        errors = sweep.preflight(sweep.expand([f"bench.out_dir={out}"]))
        assert len(errors) == 1 and errors[0].startswith(message), errors
    sweep.check_out_dir(str(tmp_path / "new" / "runs"))  # a directory still to be made is fine
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "ro") == ["f"]


def test_a_second_invocation_into_the_same_root_is_refused_naming_the_holder(tmp_path):
    """Two bench.run into one output root shared LATEST.json: the last writer won and the other's runs vanished
    from the default report. The root is held for the invocation; a second one is refused (bench.run: exit 2)."""
    import os

    first = sweep.hold_out_dir(tmp_path)
    with pytest.raises(ValueError, match=rf"bench.out_dir={tmp_path}: another bench.run is writing there \(pid {os.getpid()} "):
        sweep.hold_out_dir(tmp_path)
    first.close()  # the holder ended
    sweep.hold_out_dir(tmp_path).close()


HOLDER = """
import sys, time
from pathlib import Path
from bench import sweep
from bench.results import record
from bench.results import record
out = Path(sys.argv[1])
lock = sweep.hold_out_dir(out)
m = sweep.Manifest(out_dir=out, argv=["optimizer=muon"])
m.sweep_dir = str(out / "sweep")
for name in ("0_adamw", "1_muon"):
    run = sweep.claim_run_dir(out / "sweep" / name)
    record.write_json_atomic(run / "run.json", {"run_id": name, "status": "running", "start_time": record.now_iso()})
    m.note(run, "running")
record.finalize(out / "sweep" / "0_adamw", status="ok")
m.note(out / "sweep" / "0_adamw", "ok")
print("ready", flush=True)
time.sleep(120)
"""


def test_kill_9_of_bench_run_is_recorded_killed_by_the_next_invocation(tmp_path):
    """`kill -9` of bench.run left LATEST.json (and its running run) `running` forever. The next invocation into
    the root finds the manifest's process gone (its lock released) and records the manifest and the run that was
    still running as `killed`, naming the process; a run that had ended keeps its status."""
    import os
    import signal

    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    pid = proc.pid
    os.kill(pid, signal.SIGKILL)
    proc.wait(30)
    assert record.read_json(tmp_path / "LATEST.json")["state"] == "running"
    sweep.hold_out_dir(tmp_path).close()
    for manifest in (tmp_path / "LATEST.json", tmp_path / "sweep" / "sweep.json"):
        data = record.read_json(manifest)
        assert data["state"] == "killed" and data["pid"] == pid
        assert list(data["statuses"].values()) == ["ok", "killed"]
    killed = record.read_json(tmp_path / "sweep" / "1_muon" / "run.json")
    assert killed["status"] == "killed" and f"bench.run (pid {pid} on " in killed["error"]["message"]
    assert killed["end_time"]
    assert record.read_json(tmp_path / "sweep" / "0_adamw" / "run.json")["status"] == "ok"


def test_tool_help_names_the_module_that_runs_and_bad_arguments_are_one_line(capsys, tmp_path):
    """`bench.tools.flops --help` named `python -m bench.flops` (prints nothing); `bench.tools.quality.report
    --help` and `bench.tools.bridge_diff --help` crashed; a missing quality source was a traceback."""
    from bench.tools import bridge_diff, flops
    from bench.tools.quality import report

    assert flops.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "python -m bench.tools.flops model=" in out and "python -m bench.flops" not in out
    for main in (report.main, bridge_diff.main):
        assert main(["--help"]) == 0
        assert capsys.readouterr().out.strip() == importlib.import_module(main.__module__).__doc__.strip()
    assert report.main([]) == 2
    assert capsys.readouterr().err.startswith("error: usage: python -m bench.tools.quality.report")
    assert report.main([f"src={tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: src={tmp_path / 'none'}: no such directory (a quality sweep's output directory)\n"
    assert bridge_diff.main(["engine=megatron"]) == 2
    assert capsys.readouterr().err.startswith("error: 'engine=megatron': the engines are fixed")


def test_run_directories_are_named_by_the_optimizer_config_chosen(tmp_path):
    """`muon`, `muon_split_gate_up` and `muon_megatron` share the `name` muon: their run directories were all
    `<n>_muon`. (A Slurm dry run: the directories and records without launching anything.)"""
    out = tmp_path / "runs"
    res = subprocess.run(
        [sys.executable, "-m", "bench.run", "-m", "optimizer=muon,muon_split_gate_up", "launcher=slurm",
         "launcher.dry_run=true", f"bench.out_dir={out}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    runs = record.read_json(out / "LATEST.json")["runs"]
    assert [Path(r).name for r in runs] == ["0_muon", "1_muon_split_gate_up"]


@pytest.mark.parametrize("text", ["", "{torn", "[]"])
def test_resume_from_an_unreadable_manifest_names_it(tmp_path, text):
    """Localises `bench.resume=<empty file>` failing with "Expecting value" and no file named."""
    manifest = tmp_path / "LATEST.json"
    manifest.write_text(text)
    with pytest.raises(ValueError, match=rf"bench.resume='{manifest}': {manifest}"):
        sweep.resume_plan(str(manifest))
