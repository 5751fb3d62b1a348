"""Training an indexer by imitation: its scores should rank entries as the main attention does.

The selection is a hard top-k, so no gradient of the language-model loss reaches the index
branch. DeepSeek-V3.2 (its dense warm-up, as used for GLM-5, arXiv 2602.15763) and MiniMax
(MSA, arXiv 2606.13392) train it to imitate the main attention instead: with p the main
attention's distribution over the visible entries (averaged over the heads that share a
selection, no gradient) and I the indexer's scores,

    loss = mean over queries of  KL(p || softmax(I))

For MSA the distribution is over blocks: p sums the attention weight of each block's
positions, and I is the block score the selection ranks (the block-max of the index scores).
The indexer's input is detached, so the loss trains the index branch only. ``TrainConfig.
indexer_weight`` adds it to the training loss (0 = off); only ``msa`` layers take part
(the ``dsa`` indexer is left to the language-model loss, which does not reach it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from storelab.ops.msa import block_scores
from storelab.stores.msa import BlockSparseAttention


def msa_layers(model) -> list[int]:
    return [i for i, b in enumerate(model.blocks) if isinstance(b.token, BlockSparseAttention)]


def msa_block_targets(store: BlockSparseAttention, x_BTD: torch.Tensor) -> torch.Tensor:
    """The main attention's weight per block, [B, G, T, N] (rows sum to 1), with no gradient."""
    c = store.cfg
    B, T, _ = x_BTD.shape
    pos = torch.arange(T, device=x_BTD.device)
    with torch.no_grad():
        q_BTHK, k_BTGK, _, _ = store.project(x_BTD, pos)
        k_BTHK = k_BTGK.repeat_interleave(c.n_heads // c.n_kv_heads, dim=2)
        logits = torch.einsum("bthk,blhk->bhtl", q_BTHK.float(), k_BTHK.float()) * c.scale
        causal = torch.arange(T)[None, :] <= torch.arange(T)[:, None]
        w_BHTL = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
        w_BGTL = w_BHTL.view(B, c.n_kv_heads, -1, T, T).mean(2)
        N = -(-T // c.block_size)
        w_BGTL = F.pad(w_BGTL, (0, N * c.block_size - T))
        return w_BGTL.view(B, c.n_kv_heads, T, N, c.block_size).sum(-1)


def msa_distill_loss(store: BlockSparseAttention, x_BTD: torch.Tensor) -> torch.Tensor:
    """KL(main attention's block weights || softmax of the block scores), averaged over queries."""
    c = store.cfg
    x_BTD = x_BTD.detach()
    target = msa_block_targets(store, x_BTD)
    pos = torch.arange(x_BTD.shape[1], device=x_BTD.device)
    iq_BTGI, ik_BTI = store.index(x_BTD, pos)
    s_BGTN = block_scores(iq_BTGI, ik_BTI, positions_T=pos, block_size=c.block_size)
    logq = torch.log_softmax(s_BGTN, dim=-1).clamp_min(-1e4)  # future blocks: -inf -> finite, weight 0
    kl = torch.xlogy(target, target) - target * logq
    return kl.sum(-1).mean()


class IndexerTap:
    """Captures the inputs of the model's MSA layers during a forward pass (``with IndexerTap(m) as tap``)."""

    def __init__(self, model, enabled: bool = True):
        self.model, self.xs, self.hooks, self.enabled = model, {}, [], enabled

    def __enter__(self):
        for i in msa_layers(self.model) if self.enabled else []:
            self.hooks.append(self.model.blocks[i].token.register_forward_pre_hook(
                lambda mod, args, i=i: self.xs.__setitem__(i, args[0])))
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()

    def loss(self) -> torch.Tensor | None:
        if not self.xs:
            return None
        return sum(msa_distill_loss(self.model.blocks[i].token, x) for i, x in self.xs.items()) / len(self.xs)
