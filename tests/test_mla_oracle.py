"""MLA and DSA against transformers: DeepseekV3Attention, KimiLinearAttention,
DeepseekV32Indexer / DeepseekV32Attention and GlmMoeDsaIndexer / GlmMoeDsaAttention.

Each oracle is a whole tiny model (oracles.md settings) whose weights are re-drawn
at unit scale (the default init of 0.02 makes every output tiny and any comparison
loose); one layer's inputs are captured, its weights copied into ours, and the
outputs compared in fp32.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from storelab.ops.attention import causal_mask
from storelab.ops.indexer import index_scores
from storelab.stores.base import observe
from storelab.stores.dsa import HF_INDEXER_NAMES, DSAConfig, SelectionCache, SelectionShare
from storelab.stores.mla import HF_NAMES, MLAConfig
from tests.helpers import assert_close, capture, tiny_hf_model

MLA_NAMES, INDEXER_NAMES = HF_NAMES, HF_INDEXER_NAMES  # transformers name -> ours

MLA_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                intermediate_size=96, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                moe_intermediate_size=32, num_experts_per_tok=2, attn_implementation="eager")
DSA_TINY = dict(MLA_TINY, q_lora_rank=24, n_routed_experts=4, n_group=1, topk_group=1, index_topk=8,
                index_head_dim=16, index_n_heads=2)


def randomize(model: torch.nn.Module, seed: int = 1) -> None:
    """Unit-scale weights: matrices ~ N(0, 1/fan_in), norm gains ~ 1 + N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 1.0 if "embed" in name else p.shape[-1] ** -0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))


def copy_weights(ours: torch.nn.Module, theirs: torch.nn.Module, names: dict[str, str]) -> None:
    src = theirs.state_dict()
    dst = {}
    for key, t in src.items():
        head, _, rest = key.partition(".")
        if head in names:
            dst[f"{names[head]}.{rest}"] = t
    missing, unexpected = ours.load_state_dict(dst, strict=False)
    assert not unexpected, unexpected
    assert not [m for m in missing if not m.startswith(("indexer.", "gate."))], missing


def mla_kwargs(hf_cfg, **extra) -> dict:
    return dict(d_model=hf_cfg.hidden_size, n_heads=hf_cfg.num_attention_heads, q_lora_rank=hf_cfg.q_lora_rank,
                kv_lora_rank=hf_cfg.kv_lora_rank, qk_nope_head_dim=hf_cfg.qk_nope_head_dim,
                qk_rope_head_dim=hf_cfg.qk_rope_head_dim, v_head_dim=hf_cfg.v_head_dim, **extra)


@pytest.mark.parametrize("q_lora,absorbed,interleave", [(24, False, True), (None, False, True), (24, True, True),
                                                       (None, True, False)])
def test_mla_matches_deepseek_v3_attention(q_lora, absorbed, interleave):
    hf = tiny_hf_model("deepseek_v3", **MLA_TINY, q_lora_rank=q_lora, n_routed_experts=4, n_group=1, topk_group=1,
                       rope_interleave=interleave)
    randomize(hf)
    attn = hf.model.layers[1].self_attn
    args, kw, out = capture(hf, attn, torch.randint(0, 128, (2, 13), generator=torch.Generator().manual_seed(0)))
    cfg = MLAConfig(**mla_kwargs(hf.config, rope_theta=hf.config.rope_parameters["rope_theta"],
                                 rope_interleaved=hf.config.rope_interleave, absorbed=absorbed))
    ours = cfg.build()
    copy_weights(ours, attn, MLA_NAMES)
    y, state = ours(kw["hidden_states"])
    assert_close(y, out[0], 1e-5, "MLA vs DeepseekV3Attention")
    assert out[0].abs().max() > 0.1  # the comparison is not between near-zero outputs
    assert state.entries == 13 and state.nbytes() == cfg.footprint(13, dtype="fp32").state_bytes * 2  # batch 2


def test_mla_without_rope_matches_kimi_linear_full_layer():
    hf = tiny_hf_model("kimi_linear", **dict(MLA_TINY, num_hidden_layers=4), q_lora_rank=None, pad_token_id=0,
                       bos_token_id=1, eos_token_id=2, num_experts=4,
                       num_shared_experts=1, linear_head_dim=16, linear_num_heads=4,
                       layer_types=["linear_attention"] * 3 + ["full_attention"])
    randomize(hf)
    attn = hf.model.layers[3].self_attn
    args, kw, out = capture(hf, attn, torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0)))
    cfg = MLAConfig(**mla_kwargs(hf.config, use_rope=False))
    ours = cfg.build()
    copy_weights(ours, attn, MLA_NAMES)
    y, _ = ours(kw["hidden_states"])
    assert_close(y, out[0], 1e-5, "MLA (no rope) vs KimiLinearAttention")
    assert out[0].abs().max() > 0.1


# --- DSA ---------------------------------------------------------------------------

def dsa_from_hf(hf, layer: int, **extra) -> DSAConfig:
    c = hf.config
    return DSAConfig(**mla_kwargs(c, rope_theta=c.rope_parameters["rope_theta"]), index_n_heads=c.index_n_heads,
                     index_head_dim=c.index_head_dim, index_topk=c.index_topk, layer_index=layer, **extra)


def assert_same_selection(ours_BTk, theirs_BTk, scores_BTL, what: str) -> int:
    """Per query: the same readable set, up to positions tied at the k-th score. Returns #queries with ties."""
    B, T, _ = scores_BTL.shape
    L = scores_BTL.shape[-1]
    ties = 0
    for b in range(B):
        for t in range(T):
            q_pos = L - T + t
            visible = q_pos + 1
            ours = {int(i) for i in ours_BTk[b, t] if int(i) <= q_pos}
            theirs = {int(i) for i in theirs_BTk[b, t] if int(i) <= q_pos}
            k = min(ours_BTk.shape[-1], visible)
            assert len(ours) == len(theirs) == k, f"{what}: query {t} selects {len(ours)} / {len(theirs)}, want {k}"
            if ours == theirs:
                continue
            s = scores_BTL[b, t]
            kth = s[list(ours)].min()
            tol = 1e-5 * max(1.0, float(kth.abs()))
            for i in ours ^ theirs:  # every disagreement must sit at the k-th score
                assert abs(float(s[i] - kth)) <= tol, \
                    f"{what}: query {t} position {i} score {float(s[i]):.6g} vs k-th {float(kth):.6g}"
            ties += 1
    return ties


@pytest.mark.parametrize("family,interleaved", [("deepseek_v32", False), ("glm_moe_dsa", True)])
def test_dsa_indexer_selects_the_oracle_sets(family, interleaved):
    extra = {"index_topk_freq": 1} if family == "glm_moe_dsa" else {}
    hf = tiny_hf_model(family, **DSA_TINY, **extra)
    randomize(hf)
    T = 20
    attn = hf.model.layers[1].self_attn
    ids = torch.randint(0, 128, (2, T), generator=torch.Generator().manual_seed(0))
    _, kw_idx, hf_topk = capture(hf, attn.indexer, ids)
    _, kw_attn, hf_out = capture(hf, attn, ids)
    cfg = dsa_from_hf(hf, 1, index_rope_interleaved=interleaved)
    ours = cfg.build()
    copy_weights(ours.mla, attn, MLA_NAMES)
    copy_weights(ours.indexer, attn.indexer, INDEXER_NAMES)
    x = kw_attn["hidden_states"]
    with observe(ours) as seen:
        y, state = ours(x)
    selected = seen.last(ours, "selection")
    # our scores, recomputed from our own modules, for the tie check
    with torch.no_grad():
        p = ours.mla.project(x, torch.arange(T))
        q_BTHK, w_BTH = ours.indexer.queries(x, p.q_src_BTQ, torch.arange(T))
        scores = index_scores(q_BTHK, state.index_k, w_BTH, scale=ours.indexer.scale, mask_TL=causal_mask(T, T))
    ties = assert_same_selection(selected, hf_topk.long(), scores, f"{family} indexer")
    assert ties <= T // 2
    # where both sets agree, the attention outputs agree too
    same = torch.tensor([[set(selected[b, t, : min(8, t + 1)].tolist())
                          == {int(i) for i in hf_topk[b, t] if int(i) <= t} for t in range(T)] for b in range(2)])
    assert same.float().mean() > 0.5
    assert_close(y[same], hf_out[0][same], 1e-5, f"{family} attention output")
    assert hf_out[0].abs().max() > 0.1


def test_glm_index_share_rule_and_shared_layer():
    # the published rule: 78 layers, offset 3, freq 4 -> 21 indexer layers
    cfgs = [DSAConfig(d_model=8, n_heads=1, kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4,
                      index_n_heads=1, index_head_dim=4, index_topk=4, index_share_freq=4, index_share_offset=3,
                      layer_index=i) for i in range(78)]
    runs = [i for i, c in enumerate(cfgs) if c.runs_indexer]
    assert runs == [0, 1, 2] + list(range(6, 75, 4)) and len(runs) == 21
    hf_types = AutoConfig.for_model("glm_moe_dsa", num_hidden_layers=78, index_topk_freq=4,
                                    index_skip_topk_offset=3).indexer_types
    assert [i for i, t in enumerate(hf_types) if t == "full"] == runs
    # a reusing layer reads exactly what the oracle's shared layer reads, given the same selection
    hf = tiny_hf_model("glm_moe_dsa", **dict(DSA_TINY, num_hidden_layers=3), index_topk_freq=2,
                       index_skip_topk_offset=1)
    assert hf.config.indexer_types == ["full", "shared", "full"]
    randomize(hf)
    attn = hf.model.layers[1].self_attn
    T = 16
    _, kw, out = capture(hf, attn, torch.randint(0, 128, (1, T), generator=torch.Generator().manual_seed(3)))
    cfg = dsa_from_hf(hf, 1, index_share_freq=2, index_share_offset=1, index_rope_interleaved=True)
    assert not cfg.runs_indexer and cfg.footprint(T).scored == 0
    ours = cfg.build()
    assert ours.indexer is None
    copy_weights(ours.mla, attn, MLA_NAMES)
    share = SelectionShare()
    topk = kw["prev_topk_indices"].long()
    share.publish(seen=0, T=T, pos_BTk=topk, valid_BTk=topk <= torch.arange(T)[None, :, None])
    y, state = ours(kw["hidden_states"], SelectionCache(share=share))
    assert_close(y, out[0], 1e-5, "reusing layer vs GlmMoeDsaAttention (shared)")
    assert state.index_k is None
