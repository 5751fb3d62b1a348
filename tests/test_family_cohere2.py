"""The Command R7B / A family (``storelab/checkpoint/families/cohere2.py``) and the two model-level facts it
needs (``LayerConfig.norms = "parallel"``, ``ModelConfig.norm_kind = "layer"``).

Against transformers 5.23's tiny ``cohere2`` models saved with ``save_pretrained``: the config read (one
LayerNorm per layer, interleaved RoPE on the local layers, none on the global ones, the head size from
hidden_size / heads, the logit scale), logits equal in fp32 (1e-5 of the logits' scale) and bf16 (5 %),
chunked prefill + steps equal to one pass, transformers' cache bytes after a prefill (windows filled and
not), parameters from config.json alone equal to the saved tensors.

The model-level facts against plain computations: the bias-free LayerNorm against torch's
``layer_norm`` (value and gradient); a parallel block equal to x + f(n(x)) + g(n(x)) written out with the
block's own modules, and a pre-norm block still equal to x + f(n1(x)), then + g(n2(...)) (value and
gradient); the parameter count equal to the built model's for every norm placement; a storelab checkpoint
of a parallel LayerNorm model saved and loaded; the file forms that cannot say them refuse naming the field.
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close
from tests.test_families import ids_of
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

SPLITS_A = ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21))  # single tokens between chunks

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
# "cohere2": transformers' default pattern (three local layers to one global), biases, a logit scale that shows;
# "cohere2_alt": layer_types alternating, untied, the default logit scale
TINY = {
    "cohere2": dict(COMMON, sliding_window=6, logit_scale=0.5, attention_bias=True),
    "cohere2_alt": dict(COMMON, sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2,
                        tie_word_embeddings=False),
}


saved = saved_fixture(TINY, lambda name: "cohere2", perturb=0.3)

@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name, splits=SPLITS_A)


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    check_bf16(*saved(name), what=name)


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(name, T, saved):
    check_cache(*saved(name), T)


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    check_counts(*saved(name))


@pytest.mark.parametrize("setting", list(TINY))
def test_config_read(setting, saved):
    """One LayerNorm per layer read by both mixers, windows one less than sliding_window, RoPE (interleaved) on
    the local layers only, the logit scale and the tie as the file says."""
    hf, folder = saved(setting)
    cfg = read_model_config(folder)
    assert {lay.norms for lay in cfg.layers} == {"parallel"} and cfg.norm_kind == "layer"
    assert cfg.norm_eps == hf.config.layer_norm_eps and cfg.logit_scale == hf.config.logit_scale
    toks = [lay.token for lay in cfg.layers]
    want = ["window", "window", "window", "attention"] if setting == "cohere2" else ["window", "attention"] * 2
    assert [a.KIND for a in toks] == want
    assert [a.partial_rotary for a in toks] == [1.0 if k == "window" else 0.0 for k in want]
    assert all(a.rope_interleaved and a.head_dim == 16 for a in toks)
    assert toks[0].window == hf.config.sliding_window - 1
    assert cfg.tie_embeddings == (setting == "cohere2") and toks[0].qkv_bias == (setting == "cohere2")


def test_head_dim_from_heads(tmp_path):
    """``Cohere2Config`` sets head_dim = hidden_size / heads whatever the file says; so does the reader."""
    hf = dict(COMMON, model_type="cohere2", sliding_window=6, head_dim=8)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert {lay.token.head_dim for lay in read_model_config(tmp_path).layers} == {16}


# -- the model-level facts ------------------------------------------------------------------------------
D = 32


def _model(norms: str, norm_kind: str, n_layers: int = 2):
    from storelab.models.config import LayerConfig, ModelConfig
    from storelab.models.model import Model
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    lay = LayerConfig(token=AttentionConfig(d_model=D, n_heads=2, head_dim=16), channel=FFNConfig(d_model=D, d_ff=48),
                      depth=ResidualConfig(d_model=D), norms=norms)
    cfg = ModelConfig(name="t", d_model=D, vocab_size=64, layers=[lay] * n_layers, norm_kind=norm_kind,
                      norm_eps=1e-5, logit_scale=0.5)
    torch.manual_seed(0)
    m = Model(cfg)
    with torch.no_grad():  # norms away from one, so that a norm read in the wrong place shows
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return m


def test_layer_norm_against_torch():
    from storelab.ops.norm import layer_norm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, D, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(D, generator=g, dtype=torch.float64, requires_grad=True)
    y = layer_norm(x, w, 1e-5)
    ref = torch.nn.functional.layer_norm(x, (D,), w, None, 1e-5)
    assert_close(y, ref, atol=1e-12, what="layer_norm")
    gy = torch.randn(y.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(y, (x, w), gy)
    want = torch.autograd.grad(ref, (x, w), gy)
    for a, b, n in zip(got, want, ("dx", "dw")):
        assert_close(a, b, atol=1e-12, what=f"layer_norm {n}")


def _written_out(m, ids):
    """The model's logits from its own modules, the block's rule written out per placement."""
    h = m.embed(ids)
    for blk in m.blocks:
        if blk.norms == "parallel":
            u = blk.norm_token(h)
            h = h + blk.token(u)[0] + blk.channel(u)[0]
        else:  # "pre"
            h = h + blk.token(blk.norm_token(h))[0]
            h = h + blk.channel(blk.norm_channel(h))[0]
    return m.lm_head(m.norm(h)) * m.cfg.logit_scale


@pytest.mark.parametrize("norms, norm_kind", [("parallel", "layer"), ("parallel", "rms"), ("pre", "rms"),
                                              ("pre", "layer")])
def test_block_equals_its_rule(norms, norm_kind):
    """Value and gradient of every parameter equal the written-out rule; a parallel layer holds one norm."""
    from storelab.ops.norm import LayerNorm, RMSNorm

    m = _model(norms, norm_kind)
    want_norm = LayerNorm if norm_kind == "layer" else RMSNorm
    assert all(isinstance(x, want_norm) for x in m.modules() if isinstance(x, (LayerNorm, RMSNorm)))
    assert all((b.norm_channel is None) == (norms == "parallel") for b in m.blocks)
    ids = ids_of(9)[:, :9] % 64
    got = m(ids)[0]
    ref = _written_out(m, ids)
    assert_close(got, ref, atol=1e-6, what=f"{norms}/{norm_kind} logits")
    params = [p for p in m.parameters()]
    g1 = torch.autograd.grad(got.square().sum(), params)
    g2 = torch.autograd.grad(ref.square().sum(), params)
    for (name, _), a, b in zip(m.named_parameters(), g1, g2):
        assert_close(a, b, atol=1e-5, what=f"{norms}/{norm_kind} d{name}")


@pytest.mark.parametrize("norms", ["pre", "post", "sandwich", "parallel"])
def test_counts_equal_the_built_model(norms):
    from storelab.models.accounting import count_params

    m = _model(norms, "layer")
    assert count_params(m.cfg).stored == sum(p.numel() for p in m.parameters())
    block_norms = [p for n, p in m.named_parameters() if n.split(".")[-2].startswith(("norm", "post_norm"))]
    assert count_params(m.cfg).by_part["norms"] == sum(p.numel() for p in block_norms)  # the final one included
    assert len(block_norms) == sum(lay.n_norms() for lay in m.cfg.layers) + 1


def test_native_checkpoint_keeps_both(tmp_path):
    """A storelab checkpoint of a parallel LayerNorm model loads as the same model (config and logits)."""
    from storelab.checkpoint import save

    m = _model("parallel", "layer").eval()
    save(m, tmp_path / "ck")
    back = load(tmp_path / "ck")
    assert back.cfg.norm_kind == "layer" and {lay.norms for lay in back.cfg.layers} == {"parallel"}
    ids = ids_of(7) % 64
    with torch.no_grad():
        assert_close(back(ids)[0], m(ids)[0], atol=1e-6, what="saved and loaded")


def test_refusals_name_the_field():
    from storelab.models.config import LayerConfig, ModelConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig

    with pytest.raises(ValueError, match="norms: 'parallel' needs a channel mixer"):
        LayerConfig(token=AttentionConfig(d_model=D, n_heads=2, head_dim=16), depth=ResidualConfig(d_model=D),
                    norms="parallel")
    lay = _model("pre", "rms").cfg.layers[0]
    with pytest.raises(ValueError, match="norm_kind: must be one of rms, layer"):
        ModelConfig(name="t", d_model=D, vocab_size=64, layers=[lay], norm_kind="batch")
    with pytest.raises(ValueError, match="norm_kind: 'layer' has no compact file form"):
        ModelConfig(name="t", d_model=D, vocab_size=64, layers=[lay], norm_kind="layer").to_dict()
