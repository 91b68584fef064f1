"""README, docs/ and reports/ stay a product's documentation: one-screen README, links that resolve, report folders
with a protocol and a reproduce script, and no lab-notebook words in tracked non-code files."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 100
MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_REF = re.compile(r"`?((?:docs|reports)/[\w./-]+?\.md)(#[\w-]+)?`?")
ANCHOR = re.compile(r'<a id="([\w-]+)"></a>')
# process words: a study names its measurement batches by host, commit and date
# The diary words, spelled in pieces so that this file does not itself carry them.
_SESSION, _ANCHORS = "sess" + "ion", "anch" + "ors"
PROCESS_WORDS = re.compile(
    rf"(?i:{_SESSION}|device call|issue #?\d|{_ANCHORS}\.md)|\bcalls? [A-Z](?:-[A-Z])?\b"
)
TEXT_SUFFIXES = {".md", ".yaml", ".yml", ".sh", ".txt", ".csv", ".json", ".jsonl", ".toml", ".cfg", ".ini"}


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / p for p in out.splitlines()]


def _docs_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_readme_fits_one_screen():
    """Localises a README that grew back into a results diary."""
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines, more than {README_MAX_LINES}"


@pytest.mark.parametrize("doc", _docs_files(), ids=lambda p: p.name)
def test_links_resolve(doc: Path):
    """Every relative markdown link and every `docs/...md` / `reports/...md` reference (with its #anchor) in README
    and docs/ points at a file (and anchor) in the repository."""
    text = doc.read_text()
    broken = []
    for target in MD_LINK.findall(text):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            broken.append(target)
    for path, anchor in DOC_REF.findall(text):
        f = REPO / path
        if not f.exists():
            broken.append(path)
        elif anchor and anchor[1:] not in ANCHOR.findall(f.read_text()):
            broken.append(path + anchor)
    assert not broken, f"{doc.relative_to(REPO)}: unresolved {broken}"


def test_reference_anchors_cited_exist():
    """Configs, docs and code cite `docs/references.md#<anchor>`; each anchor must exist there."""
    anchors = set(ANCHOR.findall((REPO / "docs/references.md").read_text()))
    cited = {
        (p.relative_to(REPO).as_posix(), a)
        for p in _tracked()
        if p.suffix in {".yaml", ".md", ".py"} and p.exists()
        for a in re.findall(r"docs/references\.md#([\w-]+)", p.read_text())
    }
    assert cited, "no citation of docs/references.md found: the check itself is broken"
    assert not {(f, a) for f, a in cited if a not in anchors}


def test_every_report_folder_has_readme_reproduce_and_run_json():
    """A report folder is an artefact a user can regenerate: README.md (protocol, command), one reproduce.sh and
    run.json (provenance: commit, versions, host, command, date). `golden/` holds regression rows, not a report."""
    folders = {
        p.relative_to(REPO / "reports").parts[0] for p in _tracked() if p.is_relative_to(REPO / "reports")
    }
    folders.discard("golden")
    assert folders
    missing = [
        f"{d}/{name}"
        for d in sorted(folders)
        for name in ("README.md", "reproduce.sh", "run.json")
        if not (REPO / "reports" / d / name).is_file()
    ]
    assert not missing, f"report folders without their README.md / reproduce.sh / run.json: {missing}"


def test_report_folders_follow_naming():
    """reports/<topic>_<gpu>_<yyyymm>/: a hardware token (cpu, h200, h200x2, gb300, ...) and the month last."""
    folders = {
        p.relative_to(REPO / "reports").parts[0] for p in _tracked() if p.is_relative_to(REPO / "reports")
    }
    bad = sorted(
        d
        for d in folders - {"golden"}
        if not re.fullmatch(r"[a-z0-9_]+_(cpu|[a-z]+\d+(x\d+)?)(_[a-z0-9_]+)?_\d{6}", d)
    )
    assert not bad, f"report folders not named <topic>_<gpu>_<yyyymm>: {bad}"


def test_no_process_words_in_tracked_non_code_files():
    """Docs, configs, reports and scripts say what the code does and what was measured (host, commit, date), never
    how the work was organised."""
    hits = []
    for p in _tracked():
        if (p.suffix in TEXT_SUFFIXES or p.name in {"Makefile", "Dockerfile"}) and p.is_file():
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if m := PROCESS_WORDS.search(line):
                    hits.append(f"{p.relative_to(REPO)}:{i}: {m.group(0)!r}")
    assert not hits, "\n".join(hits[:20])


def test_process_word_pattern_catches_the_diary_forms():
    """The pattern itself: it must flag the forms the reports used to carry and leave ordinary prose alone."""
    for s in (
        _SESSION.title() + " 7 ran",
        "calls" + " T-V",
        "call" + " B (commit)",
        "issue" + " 7",
        _ANCHORS + ".md (f)",
        "one device call",
    ):
        assert PROCESS_WORDS.search(s), s
    for s in ("NS calls per step", "a call to torch", "each call a batch", "recall"):
        assert not PROCESS_WORDS.search(s), s


PACKAGES = ("optim", "muonbench", "recipes", "bench", "experiments")
DOTTED_NAME = re.compile(r"(?<![\w./-])((?:{})(?:\.\w+)+)".format("|".join(PACKAGES)))
REPO_PATH = re.compile(
    r"(?<![\w./<-])((?:{})/[\w./-]*)".format("|".join((*PACKAGES, "conf", "tests", "docs", "reports")))
)
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "csv", "yaml", "sh", "png", "txt"}


def _cited_docs() -> list[Path]:
    return [*_docs_files(), *sorted((REPO / "reports").glob("*/README.md"))]


def _bench_config_keys() -> set[str]:
    """Fields of the `bench` config group: `bench.steps` in a doc is a setting, not a module."""
    import ast

    tree = ast.parse((REPO / "muonbench" / "schema.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BenchConfig")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _module(dotted: str) -> tuple[Path | None, list[str]]:
    """The longest prefix of `dotted` that is one of our modules or packages, and the attribute path after it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, parts[i:]
        if i > 1 and base.is_dir():  # a folder without __init__ (experiments/<name>/)
            return base, parts[i:]
    return None, parts


def stale_names(doc: Path, bench_keys: set[str]) -> list[str]:
    """Module names (`bench.results.collect`, `optim.kernels.plan.pick`) and repository paths (`bench/flops.py`,
    `conf/hardware/`) a doc cites that do not exist. Placeholders (`reports/<name>/`, `*.png`) are skipped."""
    text, out = doc.read_text(), []
    for m in DOTTED_NAME.finditer(text):
        name = m.group(1)
        path, rest = _module(name)
        if path is None or (
            rest
            and rest[0] not in FILE_SUFFIXES
            and (path.is_dir() or not re.search(rf"\b{re.escape(rest[0])}\b", path.read_text()))
            and not (path == REPO / "bench" / "__init__.py" and rest[0] in bench_keys)
        ):
            out.append(name)
    for m in REPO_PATH.finditer(text):
        if text[m.end() : m.end() + 1] in ("<", "*", "{"):
            continue
        rel = m.group(1).rstrip(".,:;)")
        if not (REPO / rel).exists() and not (doc.parent / rel).exists():
            out.append(rel)
    return out


@pytest.mark.parametrize("doc", _cited_docs(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_module_and_file_names_in_docs_exist(doc: Path):
    """A renamed module or moved file leaves no stale name in README, docs/ or a report's README."""
    assert stale_names(doc, _bench_config_keys()) == []


def test_stale_name_check_sees_a_stale_name(tmp_path: Path):
    """The check itself: a moved module, a missing attribute and a missing file are found; settings, placeholders
    and existing names are not."""
    doc = tmp_path / "d.md"
    doc.write_text(
        "`bench.ns_tiles`, `bench/peak.py`, `optim.kernels.plan.no_such_function`; fine: `bench.steps`, "
        "`optim.kernels.plan.pick`, `bench/results/record.py`, `reports/<name>/`, `bench.tools.perfmodel.data`.\n"
    )
    assert stale_names(doc, _bench_config_keys()) == [
        "bench.ns_tiles",
        "optim.kernels.plan.no_such_function",
        "bench/peak.py",
    ]


def layout_mismatches(readme: str, root: Path) -> list[str]:
    """Names in the README's layout block that are not in the tree: each entry's top folder, every `name/` and
    `name.py` (under that folder or the repository), and every bare lower-case item of a list (a module or folder
    somewhere under the entry's folder)."""
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    entries: list[tuple[str, str]] = []
    for line in block.strip("\n").splitlines():
        if line and not line[0].isspace():
            top, _, rest = line.partition(" ")
            entries.append((top.rstrip("/"), rest))
        elif entries:
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
    out = []
    for top, text in entries:
        base = root / top
        if not base.is_dir():
            out.append(f"{top}/")
            continue
        for name in re.findall(r"(?<![\w/.])([\w]+(?:/\w+)*/|\w+\.py)(?![\w/])", text):
            if not (base / name).exists() and not (root / name).exists():
                out.append(f"{top}/{name}")
        for piece in re.split(r"[,;():]", text):
            name = piece.strip()
            if re.fullmatch(r"[a-z][a-z0-9_]*", name) and not (
                any(base.rglob(f"{name}.py")) or any(p.is_dir() for p in base.rglob(name))
            ):
                out.append(f"{top}: {name}")
    return out


def test_readme_layout_matches_the_tree():
    """Every folder, file and module the layout page (docs/layout.md) names exists."""
    assert layout_mismatches((REPO / "docs" / "layout.md").read_text(), REPO) == []


def test_layout_check_sees_a_missing_name(tmp_path: Path):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "run.py").write_text("")
    (tmp_path / "bench" / "results" / "record.py").write_text("")
    readme = (
        "## Layout\n\n```\nbench/        run, launch, results/ (record, collect); engines/\n"
        "              tools/ (flops, ...)\nconfig/       gone\n```\n"
    )
    assert sorted(layout_mismatches(readme, tmp_path)) == sorted(
        ["bench/engines/", "bench/tools/", "bench: launch", "bench: collect", "bench: flops", "config/"]
    )


def test_no_dated_measurements_in_product_code():
    """Code says why and points to the doc holding the numbers: no dated measurement (`2026-12-02`, `2026-12`) in
    the comments or docstrings of optim/, muonbench/, recipes/ or bench/."""
    date = re.compile(r"\b20\d\d-[01]\d\b")
    hits = [
        f"{p.relative_to(REPO)}:{i}"
        for pkg in ("optim", "muonbench", "recipes", "bench")
        for p in sorted((REPO / pkg).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if date.search(line)
    ]
    assert hits == []


def test_no_gpu_measurements_in_product_code():
    """A GPU measurement (`513 ms ... on an H200`) belongs in docs/ or reports/, with what it was measured on; code
    says why in a line and links the doc. Checked in optim/, muonbench/, recipes/ and bench/ outside bench/tools/
    (whose report writers and sourced constants print numbers by design)."""
    assert measurement_lines(REPO) == []


def measurement_lines(root: Path) -> list[str]:
    """`path:line` of each line with a measured quantity (ms, s, TF/s, GB/s, %) next to a GPU name."""
    gpu = re.compile(r"\b(H100|H200|B200|GB300)\b")
    qty = re.compile(r"\d[\d.,]*\s?(ms|us|s|TF/s|TFLOP/s|GB/s|%)(?![\w/])")
    hits = []
    for pkg in ("optim", "muonbench", "recipes", "bench"):
        for p in sorted((root / pkg).rglob("*.py")):
            if "tools" in p.relative_to(root).parts:
                continue
            lines = p.read_text().splitlines()
            for i, line in enumerate(lines):
                if qty.search(line) and gpu.search(" ".join(lines[max(0, i - 1) : i + 2])):
                    hits.append(f"{p.relative_to(root)}:{i + 1}")
    return hits


def test_measurement_lines_sees_a_number_beside_a_gpu(tmp_path: Path):
    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "k.py").write_text(
        "# the slice ran in 513 ms\n# on an H200\nX = 1  # a why comment\n# 75% of H200 peak\n"
    )
    (tmp_path / "bench" / "tools").mkdir(parents=True)
    (tmp_path / "bench" / "tools" / "r.py").write_text("# 701 TF/s on the H200\n")
    assert measurement_lines(tmp_path) == ["optim/k.py:1", "optim/k.py:4"]
