"""Depth stores against other people's implementations (fp32, max abs diff <= 1e-5):

* mHC vs transformers' DeepSeek-V4 (``DeepseekV4HyperConnection``, ``DeepseekV4HyperHead``);
* AttnRes vs transformers' Inkling2 (``Inkling2BlockAttentionResidual``).

Each test runs the tiny oracle model once with hooks on every depth module and on the
sublayers' outputs, then drives our mixers through the protocol (init, read, write, head)
with the captured sublayer outputs and compares every read, every state and the head.
"""

import pytest
import torch

from storelab.stores.depth import AttnResConfig, MHCConfig
from tests.helpers import assert_close, tiny_hf_model

ATOL = 1e-5


def record(model, modules: dict, *inputs):
    """Run ``model(*inputs)``; return {name: (args, output)} for each named submodule (first call)."""
    seen, handles = {}, []
    for name, mod in modules.items():
        def hook(_m, args, out, name=name):
            seen.setdefault(name, (args, out))
        handles.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def copy_(dst: torch.nn.Parameter, src: torch.Tensor) -> None:
    assert dst.shape == src.shape, f"{tuple(dst.shape)} != {tuple(src.shape)}"
    dst.data.copy_(src.detach())


# ----------------------------------------------------------------------------------- mHC
@pytest.fixture(scope="module", params=[2, 3], ids=["hc2", "hc3"])
def deepseek_v4(request):
    # hc_mult 2 as in the brief; 3 as well, since every 2 x 2 doubly stochastic matrix is
    # symmetric and would not catch a transposed mix
    return tiny_hf_model(
        "deepseek_v4", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, q_lora_rank=24, o_groups=2, o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4,
        sliding_window=8, compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
        intermediate_size=96, vocab_size=128, hc_mult=request.param, hc_sinkhorn_iters=5)


def test_mhc_matches_deepseek_v4(deepseek_v4):
    model, hf = deepseek_v4, deepseek_v4.config
    torch.manual_seed(0)
    for name, p in model.named_parameters():  # the biases start at zero: make every term count
        if ".attn_hc." in name or ".ffn_hc." in name or "hc_head" in name:
            p.data = torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.05)
    layers = model.model.layers
    mods = {"embed": model.model.embed_tokens, "head": model.model.hc_head}
    for i, layer in enumerate(layers):
        mods |= {f"hc{2 * i}": layer.attn_hc, f"hc{2 * i + 1}": layer.ffn_hc,
                 f"y{2 * i}": layer.self_attn, f"y{2 * i + 1}": layer.mlp}
    ids = torch.randint(0, hf.vocab_size, (2, 7))
    seen = record(model, mods, ids)

    n_sub = 2 * len(layers)
    cfg = MHCConfig(d_model=hf.hidden_size, n_streams=hf.hc_mult, sinkhorn_iters=hf.hc_sinkhorn_iters,
                    eps=hf.hc_eps, norm_eps=hf.rms_norm_eps)
    mixers = [cfg.build(sublayer=s, n_sublayers=n_sub) for s in range(n_sub)]
    for s, m in enumerate(mixers):
        hc = layers[s // 2].attn_hc if s % 2 == 0 else layers[s // 2].ffn_hc
        copy_(m.weight, hc.fn), copy_(m.bias, hc.base), copy_(m.scale, hc.scale)
    head = cfg.build_head(n_sublayers=n_sub)
    hh = model.model.hc_head
    copy_(head.weight, hh.hc_fn), copy_(head.bias, hh.hc_base), copy_(head.scale, hh.hc_scale)

    with torch.no_grad():
        ds = mixers[0].init(seen["embed"][1])
        for s, m in enumerate(mixers):
            (streams_in,), (post, comb, collapsed) = seen[f"hc{s}"]
            assert_close(ds.streams, streams_in, ATOL, f"streams entering sublayer {s}")
            A, C, B = m.coefficients(ds.streams)
            assert_close(C, post, ATOL, f"post C of sublayer {s}")
            assert_close(B, comb.transpose(-1, -2), ATOL, f"mix B of sublayer {s}")
            assert_close(m.read(ds), collapsed, ATOL, f"read of sublayer {s}")
            y = seen[f"y{s}"][1]
            ds = m.write(ds, y[0] if isinstance(y, tuple) else y)
        assert_close(head(ds), seen["head"][1], ATOL, "mHC head")


# ------------------------------------------------------------------------------- AttnRes
@pytest.fixture(scope="module")
def inkling2():
    return tiny_hf_model(
        "inkling2_text", hidden_size=32, num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=16, sliding_window_size=8,
        rel_extent=8, d_rel=4, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
        vocab_size=64, unpadded_vocab_size=64, eos_token_id=None, n_layers_per_attn_res_block=2,
        layer_types=["hybrid_sliding"] * 5)


def test_attnres_matches_inkling2(inkling2):
    model, hf = inkling2, inkling2.config
    torch.manual_seed(0)
    for name, p in model.named_parameters():  # the queries start at zero: randomise them
        if name.endswith("_input.query"):
            p.data = torch.randn_like(p) * 2
    layers, text = model.model.layers, model.model
    mods = {"embed": text.embed_tokens, "head": text.final_input}
    for i, layer in enumerate(layers):
        mods |= {f"y{2 * i}": layer.post_attention_convolution, f"y{2 * i + 1}": layer.post_mlp_convolution,
                 f"x{2 * i + 1}": layer.mlp_input}
        if layer.attention_input is not None:
            mods[f"x{2 * i}"] = layer.attention_input
    ids = torch.randint(0, hf.vocab_size, (2, 6))
    seen = record(model, mods, ids)

    n_sub = 2 * len(layers)
    cfg = AttnResConfig(d_model=hf.hidden_size, group_size=hf.n_layers_per_attn_res_block, count="layers",
                        normalize_values=True, key_norm_weight=False, scale_scores=True)
    mixers = [cfg.build(sublayer=s, n_sublayers=n_sub) for s in range(n_sub)]
    for s, m in enumerate(mixers[1:], start=1):
        src = layers[s // 2].attention_input if s % 2 == 0 else layers[s // 2].mlp_input
        copy_(m.reader.query, src.query)
    head = cfg.build_head(n_sublayers=n_sub)
    copy_(head.reader.query, text.final_input.query)

    with torch.no_grad():
        e = seen["embed"][1]
        ds = mixers[0].init(e)
        assert_close(mixers[0].read(ds), e, 0, "sublayer 0 reads the embedding")
        n_sources = []
        for s, m in enumerate(mixers):
            if s > 0:
                assert_close(m.read(ds), seen[f"x{s}"][1][0], ATOL, f"read of sublayer {s}")
            n_sources.append(len(ds.sources()))
            ds = m.write(ds, seen[f"y{s}"][1])
        assert_close(head(ds), seen["head"][1][0], ATOL, "AttnRes head")
    # 5 layers in groups of 2: the sources grow as 1, 2, 2, 2, 2, 3, 3, 3, 3, 4 and the head sees 4
    assert n_sources == [1, 2, 2, 2, 2, 3, 3, 3, 3, 4] and len(ds.sources()) == cfg.max_sources(5) == 4
