"""Build a transformers causal LM of any supported family (`model.family`, transformers' model_type) from our
`ModelConfig`, through `AutoModelForCausalLM.from_config`.

The config is `muonbench.families.config_json` (the one `ModelConfig` -> Hugging Face builder) with the
vocabulary padded the way Megatron pads it (`bench.flops.padded_vocab_size`), so the FLOPs formula matches the
built model. The model gets a tiny random init (transformers' own `_init_weights`, std 0.02) under a fixed seed,
so two runs with the same seed start from the same weights.
"""

from __future__ import annotations

from typing import Any

from bench.flops import padded_vocab_size
from muonbench.families import FAMILIES, config_json
from muonbench.schema import ModelConfig


def hf_config(model: ModelConfig) -> Any:
    """The transformers config of `model` (the config class of `model.family`), vocabulary padded."""
    from transformers import AutoConfig

    vocab = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by)
    kw = config_json(model, vocab_size=vocab)
    return AutoConfig.for_model(kw.pop("model_type"), **kw)


def build_model(model: ModelConfig, *, seed: int, dtype: Any = None) -> Any:
    """A randomly initialised causal LM of `model.family` (train mode): `AutoModelForCausalLM.from_config`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = hf_config(model)
    config._attn_implementation = FAMILIES[model.family].attn_implementation
    torch.manual_seed(seed)
    net = AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        net = net.to(dtype=dtype)
    net.train()
    return net
