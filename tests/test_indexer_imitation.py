"""The indexers learn by imitation: training on the loss each selecting store hands to training
(``training_signals()``, ``"indexer"``) raises the recall of the exact top-k on a fixed example.

The exact top-k of a query is the k entries (positions, MSA's blocks, CSA's pooled entries) the
main attention weighs most, its weights averaged over the heads (a group's heads for MSA): what
the indexer's selection should hold. Recall = |selected & exact| / k over the queries that see
more than k entries (the others read everything). Only the indexer's parameters move (Adam on
the imitation loss); the attention, the teacher, is fixed, so the exact top-k is too.
"""

from __future__ import annotations

import pytest
import torch

from storelab.ops.indexer import attention_target, selection_mask, top_positions
from storelab.ops.msa import block_attention_target
from storelab.ops.norm import rms_norm
from storelab.stores.base import observe, training_signals
from storelab.stores.compressed import CSAConfig
from storelab.stores.dsa import DSAConfig, HierarchicalConfig
from storelab.stores.msa import MsaConfig

B, T, D, K = 2, 48, 32, 6
MLA = dict(d_model=D, n_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
           v_head_dim=8, index_n_heads=4, index_head_dim=16)


def _recall(sel_XL: torch.Tensor, exact_XL: torch.Tensor, rows_X: torch.Tensor) -> float:
    """Mean over the rows of |selected & exact| / |exact| (bool masks, rows flattened)."""
    hit = (sel_XL & exact_XL).sum(-1).float() / exact_XL.sum(-1).float()
    return float(hit[rows_X].mean())


def dsa_recall(m, x) -> float:
    """Positions: the selection (``"selection"``) against the attention's top k."""
    pos = torch.arange(T)
    with torch.no_grad(), observe(m) as seen:
        m(x)
        p = m.mla.project(x, pos)
        causal = pos[None, :] <= pos[:, None]
        target = attention_target(m.mla.absorbed_query(p), torch.cat([p.latent_BTC, p.k_rope_BTR], -1),
                                  scale=m.cfg.scale, mask_TL=causal)
    sel = seen.last(m, "selection")
    exact = selection_mask(*top_positions(target, K), T)
    chosen = selection_mask(sel, torch.ones_like(sel, dtype=torch.bool), T)
    return _recall(chosen.flatten(0, 1), exact.flatten(0, 1), (pos >= K).repeat(B))


def msa_recall(m, x) -> float:
    """Blocks: the groups' selected blocks (``"blocks"``) against the attention's top blocks."""
    c = m.cfg
    pos = torch.arange(T)
    with torch.no_grad(), observe(m) as seen:
        m(x)
        q, k, _, _ = m.project(x, pos)
        target = block_attention_target(q, k, positions_T=pos, block_size=c.block_size, scale=c.scale)
    blocks = seen.last(m, "blocks")                                       # [B, G, T, k], -1 = none
    N = target.shape[-1]
    exact = selection_mask(*top_positions(target.flatten(0, 1), c.top_blocks), N)
    chosen = selection_mask(blocks.clamp_min(0).flatten(0, 1), (blocks >= 0).flatten(0, 1), N)
    rows = (pos // c.block_size + 1 > c.top_blocks).repeat(B * c.n_kv_heads)
    return _recall(chosen.flatten(0, 1), exact.flatten(0, 1), rows)


def csa_recall(m, x) -> float:
    """Pooled entries: the entries the read chose (``step``'s read mask) against the attention's top k."""
    c = m.cfg
    pos = torch.arange(T)
    with torch.no_grad():
        _, cache, mask = m.step(x)
        q_res = m.q_a_norm(m.q_a(x))
        q = m._rope(rms_norm(m.q_b(q_res).view(B, T, c.n_heads, c.head_dim), None, c.eps), pos)
        N = cache.entries
        readable = (torch.arange(N)[None, :] + 1) * c.stride <= pos[:, None] + 1
        target = attention_target(q, cache.pooled[:, :N], scale=c.head_dim ** -0.5, mask_TL=readable)
    chosen = mask[..., -N:]
    exact = selection_mask(*top_positions(target.masked_fill(~readable, float("-inf")), c.index_topk), N) & readable
    rows = (readable.sum(-1) > c.index_topk).repeat(B)
    return _recall(chosen.flatten(0, 1), exact.flatten(0, 1), rows)


CASES = {
    "dsa": (lambda: DSAConfig(**MLA, index_topk=K), dsa_recall),
    "hierarchical": (lambda: HierarchicalConfig(**MLA, topk=K, pool_size=24, pool_block=4), dsa_recall),
    "msa": (lambda: MsaConfig(d_model=D, n_heads=4, n_kv_heads=2, head_dim=8, block_size=4, top_blocks=3,
                              index_head_dim=16), msa_recall),
    "csa": (lambda: CSAConfig(d_model=D, n_heads=4, head_dim=16, rope_dim=4, q_lora=16, o_groups=2, o_lora=8, pool=4,
                              stride=2, window=4, index_heads=4, index_head_dim=16, index_topk=K), csa_recall),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_imitation_raises_the_indexers_recall_of_the_exact_top_k(kind):
    make, recall = CASES[kind]
    torch.manual_seed(0)
    m = make().build()
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    with training_signals() as sig:
        m(x)
    sig.mean("indexer").backward()
    trained = [p for p in m.parameters() if p.grad is not None]    # the indexer's parameters alone
    m.zero_grad(set_to_none=True)
    before = recall(m, x)
    opt = torch.optim.Adam(trained, lr=1e-2)
    losses = []
    for _ in range(150):
        with training_signals() as sig:
            m(x)
        loss = sig.mean("indexer")
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    after = recall(m, x)
    assert losses[-1] < 0.7 * losses[0], losses[::30]
    assert after > before + 0.2 and after > 0.6, (before, after)
