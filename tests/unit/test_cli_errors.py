"""Bad input at every entry point: one line on stderr naming the override, option or file, and exit 2 (no
traceback), whether run as `muonbench <sub>` or `python -m <module>`."""

from __future__ import annotations

import sys

import pytest

import muonbench
from bench import cli
from bench import run as bench_run
from muonbench import ConfigError

BAD_OVERRIDES = ["optimizer.lr=(1", "optimizer.lr=[", "optimizer=adamw,,muon", "bench.out_dir=out/ü", "bogus"]


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("override", BAD_OVERRIDES)
def test_override_syntax_errors_name_the_override(override: str) -> None:
    """Localises Hydra's OverrideParseException escaping as a traceback (exit 1)."""
    with pytest.raises(ConfigError, match=r"^override '.*' is not Hydra override syntax"):
        muonbench.load([override])


@pytest.mark.parametrize("override", BAD_OVERRIDES[:3])
def test_tools_print_override_errors_in_one_line(override: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["flops", override]) == 2
    assert repr(override) in _one_line(capsys)


@pytest.mark.parametrize(
    "argv", [["--info", "bogus"], ["--cfg", "job", "optimizer.lr=["], ["-m", "optimizer=adamw,,muon"]]
)
def test_bench_run_refuses_bad_syntax_before_hydra(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench.run", *argv])
    with pytest.raises(SystemExit) as exc:
        bench_run.main()
    assert exc.value.code == 2
    assert "is not Hydra override syntax" in _one_line(capsys)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["balance", "model=no_such_model"], "no_such_model"),
        (["recommend", "--bogus"], "--bogus: unknown option"),
        (["model", "hf:a", "hf:b"], "'hf:b'"),
        (["regress", "compare", "--tolerance", "nan"], "--tolerance"),
    ],
)
def test_every_subcommand_answers_in_one_line(
    argv: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Localises `muonbench balance` printing a traceback where `python -m bench.tools.balance` printed one line
    (the handling sat in the module's __main__ only)."""
    assert cli.main(argv) == 2
    assert match in _one_line(capsys)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["profile=bogus"], "profile='bogus': must be one of"),
        (["optimizers=foo"], "optimizers='foo' is not one of"),
        (["steps=abc"], "steps='abc': must be an int"),
        (["out=README.md"], "out='README.md': is a file"),
    ],
)
def test_quality_arguments_are_one_line(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["quality", *argv]) == 2
    assert match in _one_line(capsys)


@pytest.mark.parametrize(("arg", "match"), [("device=tpu", "device='tpu'"), ("format=xml", "format='xml'")])
def test_ns_kernels_arguments_are_one_line(arg: str, match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ns-kernels", arg]) == 2
    assert match in _one_line(capsys)


def test_model_help_names_its_required_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["model", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: muonbench model hf:<config.json, folder or Hub id>")


def test_entry_points_silence_the_pynvml_deprecation() -> None:
    """Localises torch's `import pynvml` FutureWarning on every model=hf: run and tool help."""
    import warnings

    from bench import entry

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        entry.run(lambda: warnings.warn("The pynvml package is deprecated. Please install", FutureWarning))
        entry.run(lambda: warnings.warn("another FutureWarning", FutureWarning))
    assert [str(w.message) for w in seen] == ["another FutureWarning"]
