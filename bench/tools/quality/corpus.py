"""The `python_packages` corpus: the Python source of the installed packages and the standard library.

Files: every `*.py` under each root (default: the running interpreter's site-packages / dist-packages directories
on `sys.path`, then its stdlib directory without the site-packages inside it), skipping `__pycache__` and files
larger than `MAX_FILE_BYTES` (generated tables). Each file is named by its path relative to its root (stdlib files
as `stdlib/<path>`). Deduplication: by SHA-256 of the bytes; the first name in (root, name) order keeps the text.
Split: a file is held out when the first 8 hex digits of SHA-256(name) mod 1000 < `VAL_PERMILLE`, so the split
depends on the name only (not on which other packages are installed) and the two sets are disjoint. Training files
are ordered by that hash, so a byte cap (`corpus_max_mb`, the tokenizer's sample) takes a uniform sample across
packages. The digest covers every kept name and content hash; a resumed sweep checks it.

Manifest: per top-level package (first path component), its distribution name and version
(`importlib.metadata.packages_distributions`), file count and bytes per split; tokens are added by the encoder.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import sysconfig
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

VAL_PERMILLE = 10
MAX_FILE_BYTES = 1 << 20
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages"}


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceFile:
    name: str
    """Path relative to its root (`stdlib/...` for the standard library): the split key."""
    path: Path
    package: str
    size: int
    sha: str


def default_roots() -> list[tuple[str, Path]]:
    """(label, directory): site-packages directories on sys.path, then the stdlib."""
    roots: list[tuple[str, Path]] = []
    for entry in sys.path:
        p = Path(entry)
        if p.name in ("site-packages", "dist-packages") and p.is_dir() and ("", p) not in roots:
            roots.append(("", p))
    roots.append(("stdlib/", Path(sysconfig.get_paths()["stdlib"])))
    return roots


def _walk(root: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for f in sorted(filenames):
            if f.endswith(".py"):
                yield Path(dirpath) / f


def path_hash(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


def is_val(name: str) -> bool:
    return path_hash(name) % 1000 < VAL_PERMILLE


def _read_meta(item: tuple[str, Path, Path]) -> SourceFile | None:
    label, root, path = item
    try:
        data = path.read_bytes()
    except OSError:
        return None
    name = label + path.relative_to(root).as_posix()
    top = name.removeprefix("stdlib/").split("/", 1)[0].removesuffix(".py")
    package = "stdlib" if label == "stdlib/" else top
    return SourceFile(
        name=name, path=path, package=package, size=len(data), sha=hashlib.sha256(data).hexdigest()
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class PackageCorpus:
    train: tuple[SourceFile, ...]
    val: tuple[SourceFile, ...]
    digest: str
    num_duplicates: int
    num_skipped: int
    """Empty files and files larger than MAX_FILE_BYTES."""
    roots: tuple[str, ...]


def scan(
    roots: list[tuple[str, Path]] | None = None, *, max_file_bytes: int = MAX_FILE_BYTES
) -> PackageCorpus:
    """Find, deduplicate and split the source files under `roots` (default_roots() when None)."""
    roots = roots or default_roots()
    items = [(label, root, p) for label, root in roots for p in _walk(root)]
    with ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 1) * 2)) as pool:
        files = [f for f in pool.map(_read_meta, items, chunksize=64) if f is not None]
    skipped = [f for f in files if f.size > max_file_bytes or f.size == 0]
    seen: set[str] = set()
    kept: list[SourceFile] = []
    for f in files:
        if f.size > max_file_bytes or f.size == 0 or f.sha in seen:
            continue
        seen.add(f.sha)
        kept.append(f)
    if not kept:
        raise ValueError(f"corpus_roots={[str(r) for _, r in roots]}: no .py files found")
    kept.sort(key=lambda f: (path_hash(f.name), f.name))
    h = hashlib.sha256()
    for f in kept:
        h.update(f"{f.name}\0{f.sha}\n".encode())
    val = tuple(f for f in kept if is_val(f.name))
    train = tuple(f for f in kept if not is_val(f.name))
    if not val or not train:
        raise ValueError(
            f"corpus_roots={[str(r) for _, r in roots]}: {len(train)} training / {len(val)} held-out files; "
            "need both (more files)"
        )
    return PackageCorpus(
        train=train,
        val=val,
        digest=h.hexdigest()[:16],
        num_duplicates=len(files) - len(skipped) - len(kept),
        num_skipped=len(skipped),
        roots=tuple(str(r) for _, r in roots),
    )


def take_bytes(files: Iterable[SourceFile], max_mb: float) -> list[SourceFile]:
    """The leading files whose sizes sum to at most `max_mb` MB (all when max_mb is 0; at least one file)."""
    out: list[SourceFile] = []
    total = 0
    for f in files:
        if max_mb and out and total + f.size > max_mb * 1e6:
            break
        out.append(f)
        total += f.size
    return out


def distributions(root: Path) -> dict[str, tuple[str, str]]:
    """Top-level import name -> (distribution name, version) of the distributions installed in `root` (their
    metadata there, not the first one on sys.path: a package shadowed by PYTHONPATH keeps its own version)."""
    out: dict[str, tuple[str, str]] = {}
    for dist in sorted(metadata.distributions(path=[str(root)]), key=lambda d: d.metadata["Name"] or ""):
        declared = (dist.read_text("top_level.txt") or "").split()
        inferred = {
            f.parts[0] if len(f.parts) > 1 else f.stem
            for f in dist.files or []
            if f.suffix == ".py" and not f.parts[0].endswith((".dist-info", ".egg-info", ".."))
        }
        for top in declared or sorted(inferred):
            out.setdefault(top, (dist.metadata["Name"], dist.version))
    return out


def manifest(corpus: PackageCorpus, tokens_per_file: dict[str, int]) -> list[dict[str, Any]]:
    """One row per top-level package, most bytes first: distribution, version, files / bytes per split, and the
    files / tokens of it that were encoded (`tokens_per_file` holds the encoded files)."""
    dists = {"stdlib": ("python", platform.python_version())}
    for root in corpus.roots:
        dists = distributions(Path(root)) | dists
    rows: dict[str, dict[str, Any]] = {}
    for split, files in (("train", corpus.train), ("val", corpus.val)):
        for f in files:
            dist, version = dists.get(f.package, ("", ""))
            row = rows.setdefault(
                f.package,
                {"package": f.package, "distribution": dist, "version": version}
                | dict.fromkeys(("train_files", "train_bytes", "val_files", "val_bytes"), 0)
                | dict.fromkeys(("encoded_files", "encoded_tokens"), 0),
            )
            row[f"{split}_files"] += 1
            row[f"{split}_bytes"] += f.size
            if f.name in tokens_per_file:
                row["encoded_files"] += 1
                row["encoded_tokens"] += tokens_per_file[f.name]
    return sorted(rows.values(), key=lambda r: (-(r["train_bytes"] + r["val_bytes"]), r["package"]))
