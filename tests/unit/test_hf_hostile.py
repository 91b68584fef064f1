"""`model=hf:` with paths a shell can name and with hostile config.json files: composed, or refused in one
ConfigError naming the field or the file (never a traceback, never a transformers default, never a silent MoE)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import muonbench
from muonbench import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


def _llama(folder: Path, name: str = "config.json", **changes: object) -> Path:
    raw = json.loads((FIXTURES / "llama3_8b" / "config.json").read_text())
    raw.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    return folder / name


@pytest.mark.parametrize("folder", ["my model", "modèle_ü", "a=b", "a,b", "it's", "null", "true", "1e5"])
def test_any_path_a_shell_can_name_composes(tmp_path: Path, folder: str) -> None:
    """Localises Hydra's grammar rejecting `model=hf:` paths with spaces, `=`, `,`, quotes or non-ASCII, and a
    folder named null / true / 1e5 becoming a None, bool or float model name."""
    path = _llama(tmp_path / folder)
    m = muonbench.load([f"model=hf:{path.parent}"]).model
    assert m.source == f"hf:{path.parent}" and isinstance(m.name, str) and m.name and m.hidden_size == 4096


def test_a_leading_tilde_is_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    _llama(tmp_path / "cfg")
    assert muonbench.load(["model=hf:~/cfg"]).model.hidden_size == 4096


def test_a_json_file_is_named_after_itself(tmp_path: Path) -> None:
    """Localises `hf/my_llama.json` being named `hf` (its folder, and the placeholder's name)."""
    path = _llama(tmp_path / "hf", "my_llama.json")
    assert muonbench.load([f"model=hf:{path}"]).model.name == "my_llama"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[1, 2]", r"holds a JSON list, not an object"),
        ('"llama"', r"holds a JSON str, not an object"),
        ("\xff\xfe", r"is not a readable JSON config"),
    ],
)
def test_a_config_that_is_not_an_object_names_the_file(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError, match=match) as exc:
        muonbench.load([f"model=hf:{path}"])
    assert str(path) in str(exc.value) and str(exc.value).count("model=") == 1  # one prefix, not two


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"num_key_value_heads": "8"}, "num_key_value_heads='8'"),
        ({"num_key_value_heads": 0}, "num_key_value_heads=0"),
        ({"num_attention_heads": True}, "num_attention_heads=True"),
        ({"rope_theta": "abc"}, "rope_theta='abc'"),
        ({"vocab_size": None}, "vocab_size=None: required"),
        ({"num_hidden_layers": None}, "num_hidden_layers=None: required"),
        ({"intermediate_size": None}, "intermediate_size=None: required"),
    ],
)
def test_hostile_or_missing_fields_are_refused_by_name(tmp_path: Path, changes: dict, field: str) -> None:
    """Localises tracebacks on string / bool / zero head counts, an unnamed float('abc'), and transformers'
    class defaults (vocab 32000, 32 layers) standing in for fields the file does not state."""
    with pytest.raises(ConfigError, match=field.replace("(", r"\(")):
        muonbench.load([f"model=hf:{_llama(tmp_path, **changes)}"])


def test_mla_needs_its_kv_lora_rank(tmp_path: Path) -> None:
    raw = json.loads((FIXTURES / "deepseek_v3" / "config.json").read_text())
    del raw["kv_lora_rank"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"kv_lora_rank=None: required"):
        muonbench.load([f"model=hf:{tmp_path}"])


@pytest.mark.parametrize(
    ("base", "changes"),
    [
        ("qwen3_30b_a3b", {"mlp_only_layers": list(range(48))}),
        ("deepseek_v3", {"first_k_dense_replace": 1000}),
    ],
)
def test_an_all_dense_config_gets_no_moe_layer(tmp_path: Path, base: str, changes: dict) -> None:
    """Localises the slice rule (keep one MoE layer) adding a MoE layer to a model that has none."""
    shutil.copytree(FIXTURES / base, tmp_path / base)
    raw = json.loads((tmp_path / base / "config.json").read_text()) | changes
    (tmp_path / base / "config.json").write_text(json.dumps(raw))
    m = muonbench.load([f"model=hf:{tmp_path / base}"]).model
    assert m.num_dense_layers == m.num_layers
    sliced = muonbench.load([f"model=hf:{tmp_path / base}", "model.num_layers=2"]).model
    assert sliced.num_dense_layers == 2
