"""Numbers quoted in README.md, docs/ and reports/*/README.md are generated from the reports' `summary.json` files.

A quote is a marked span whose opening comment names the report, the key and the format::

    <!-- gen byo_models_h200_202612:llama3_8b/bridge.ratio_model_only ratio:3 -->TEXT<!-- /gen -->

`python -m bench.tools.docs` (`make docs`) rewrites every TEXT from `reports/<report>/summary.json`; `--check` only
reports the quotes that differ (exit 1), which is what the test suite runs. A key path is dot-separated; a segment
`field=value` picks the element of a list whose `field` equals `value` (`cases.case=muon_megatron.ratio`), a
segment `N` its N-th element.

Formats:

- `ratio[:N]`: the value to N decimals (default 3) with its 95% interval and protocol, read beside it in the
  summary: `<key>_ci95` (or `ci95` beside `ratio`), runs per arm, steady steps per run and whether the order was a
  crossover. A ratio a summary marks `no_interval` is quoted with that text (its spread) instead.
- `f:SPEC`: `format(value, SPEC)`; `ms:SPEC` the value x 1000; `pct:SPEC` the value x 100 followed by `%`;
  `x:SPEC` the value followed by `x`; `gb:SPEC` bytes as GB (1e9); `range:SPEC` a two-element list as `lo-hi`; `text` the value as it stands.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
QUOTE = re.compile(r"<!-- gen (?P<report>[\w.-]+):(?P<key>\S+) (?P<fmt>\S+) -->(?P<text>.*?)<!-- /gen -->", re.DOTALL)


def doc_files(repo: Path = REPO) -> list[Path]:
    """The files whose quotes are generated: README.md, docs/*.md and the reports' README.md."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md")), *sorted((repo / "reports").glob("*/README.md"))]


def _step(node: Any, segment: str, path: str) -> Any:
    if isinstance(node, list) and "=" in segment:
        field, want = segment.split("=", 1)
        hits = [x for x in node if isinstance(x, dict) and str(x.get(field)) == want]
        if len(hits) != 1:
            raise KeyError(f"{path}: {len(hits)} elements with {field}={want}")
        return hits[0]
    if isinstance(node, list) and segment.isdigit() and int(segment) < len(node):
        return node[int(segment)]
    if isinstance(node, dict) and segment in node:
        return node[segment]
    raise KeyError(f"{path}: no key {segment!r}")


def lookup(summary: Any, key: str) -> tuple[Any, list[Any]]:
    """The value at `key` and the chain of containers above it (innermost last)."""
    chain, node = [], summary
    for seg in key.split("."):
        chain.append(node)
        node = _step(node, seg, key)
    return node, chain


def interval_of(container: dict[str, Any], leaf: str) -> list[float] | None:
    """The 95% interval stored beside ratio `leaf`: `<leaf>_ci95`, `<stem>_ci95` for `<stem>_ratio`, or `ci95` beside
    a key named `ratio`."""
    names = [f"{leaf}_ci95"]
    if leaf == "ratio":
        names.append("ci95")
    if leaf.endswith("_ratio"):
        names.append(f"{leaf[: -len('_ratio')]}_ci95")
    for n in names:
        v = container.get(n)
        if isinstance(v, list) and len(v) == 2:
            return v
    return None


def no_interval_of(container: dict[str, Any], leaf: str) -> str | None:
    """The text a summary gives in place of an interval (`no_interval: {leaf: "spread ..."}`)."""
    marked = container.get("no_interval")
    return marked.get(leaf) if isinstance(marked, dict) else None


def _arms(value: Any, sep: str) -> str | None:
    if isinstance(value, dict) and value:
        vals = [str(v) for v in value.values()]
        return vals[0] if sep == "/" and len(set(vals)) == 1 else sep.join(vals)
    if isinstance(value, int):
        return str(value)
    return None


def is_crossover(order: str) -> bool:
    """Whether a run order alternates in crossover blocks (A B B A ..., or B A A B ...) with at least one full pair."""
    arms = order.split()
    if len(arms) < 4:
        return False
    first = arms[0]
    return all((a == first) == (i % 4 in (0, 3)) for i, a in enumerate(arms))


def protocol(chain: list[Any]) -> str:
    """Runs per arm x steady steps per run, crossover or not, from the innermost container that records them."""
    for c in reversed(chain):
        if not isinstance(c, dict):
            continue
        if isinstance(c.get("protocol"), str):
            return c["protocol"]
        runs = _arms(c.get("runs_per_arm"), "+") or _arms(c.get("runs"), "+")
        steps = _arms(c.get("steady_steps_per_run"), "/")
        if steps is None and isinstance(c.get("steady_steps"), dict) and isinstance(c.get("runs"), dict):
            # bench.tools.crossover counts an arm's steady steps over all its runs
            per = {k: v / c["runs"][k] for k, v in c["steady_steps"].items() if c["runs"].get(k)}
            steps = _arms({k: int(v) if v == int(v) else round(v, 1) for k, v in per.items()}, "/")
        if runs is None or steps is None:
            if isinstance(c.get("seeds"), int):
                return f"{c['seeds']} seed{'s' if c['seeds'] != 1 else ''}"
            continue
        order = c.get("order", "")
        how = "crossover" if is_crossover(order) else f"order {order}" if order else "order not recorded"
        return f"{runs} runs x {steps} steady steps, {how}"
    raise KeyError("no runs / steady steps recorded beside this ratio (add `protocol` to the summary)")


def _num(value: Any, spec: str) -> str:
    return format(float(value), spec)


def render(summary: Any, key: str, fmt: str) -> str:
    """The quote of `key` in `summary` in format `fmt` (module docstring)."""
    value, chain = lookup(summary, key)
    kind, _, spec = fmt.partition(":")
    if kind == "ratio":
        nd = int(spec or 3)
        leaf, parent = key.rsplit(".", 1)[-1], chain[-1]
        ci = interval_of(parent, leaf)
        head = f"{value:.{nd}f}"
        if ci is not None and not all(math.isfinite(x) for x in ci):  # nan: the tool had fewer than two runs per arm
            return f"{head} (no interval: fewer than two runs per arm; {protocol(chain)})"
        if ci is not None:
            return f"{head} (95% interval {ci[0]:.{nd}f}-{ci[1]:.{nd}f}; {protocol(chain)})"
        spread = no_interval_of(parent, leaf)
        if spread is None:
            raise KeyError(f"{key}: a ratio without `_ci95` or a `no_interval` entry")
        return f"{head} (no interval: {spread})"
    if kind == "f":
        return _num(value, spec)
    if kind == "ms":
        return _num(float(value) * 1e3, spec)
    if kind == "pct":
        return _num(float(value) * 100, spec) + "%"
    if kind == "x":
        return _num(value, spec) + "x"
    if kind == "gb":
        return _num(float(value) / 1e9, spec) + " GB"
    if kind == "range":
        return f"{_num(value[0], spec)}-{_num(value[1], spec)}"
    if kind == "text":
        return str(value)
    raise ValueError(f"format={fmt!r}: not one of ratio[:N], f:SPEC, ms:SPEC, pct:SPEC, x:SPEC, gb:SPEC, range:SPEC, text")


def regenerate(text: str, reports: Path) -> str:
    """`text` with every quote rewritten from its summary."""
    cache: dict[str, Any] = {}

    def sub(m: re.Match[str]) -> str:
        report = m["report"]
        if report not in cache:
            cache[report] = json.loads((reports / report / "summary.json").read_text())
        new = render(cache[report], m["key"], m["fmt"])
        return m.group(0).replace(f"-->{m['text']}<!--", f"-->{new}<!--", 1)

    return QUOTE.sub(sub, text)


def stale(repo: Path = REPO) -> list[str]:
    """One line per quote in README.md and docs/ that differs from its summary."""
    out = []
    for f in doc_files(repo):
        text = f.read_text()
        new = regenerate(text, repo / "reports")
        if new == text:
            continue
        for old_m, new_m in zip(QUOTE.finditer(text), QUOTE.finditer(new), strict=True):
            if old_m["text"] != new_m["text"]:
                out.append(f"{f.relative_to(repo)}: {old_m['report']}:{old_m['key']} is "
                           f"{new_m['text']!r}, quoted {old_m['text']!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tools.docs", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="list quotes that differ from their summaries; exit 1 if any")
    args = p.parse_args(argv)
    if args.check:
        diffs = stale()
        print("\n".join(diffs) or "every quote matches its summary")
        return 1 if diffs else 0
    for f in doc_files():
        text = f.read_text()
        new = regenerate(text, REPO / "reports")
        if new != text:
            f.write_text(new)
            print(f"rewrote {f.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
