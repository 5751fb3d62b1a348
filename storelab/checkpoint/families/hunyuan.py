"""Hunyuan (Tencent; ``hunyuan_v1_dense``: Hunyuan-0.5B to 7B; ``hunyuan_v1_moe``: Hunyuan-A13B; ``hunyuan``: the
remote-code ``HunYuanForCausalLM`` / ``HunYuanMoEV1ForCausalLM`` file Hunyuan-A13B-Instruct was published with): Llama's
decoder with per-head q/k RMSNorms applied after RoPE.

* attention: GQA with RoPE, ``head_dim`` (hidden / heads when the file names none), ``attention_bias`` on all
  four projections; ``query_layernorm`` / ``key_layernorm`` (one RMSNorm of head_dim, shared by the heads)
  normalise the rotated queries and keys (our ``qk_norm_scope = "head_after_rope"``: a weight per channel does
  not commute with the rotation);
* rope: a ``dynamic`` scaling with ``alpha`` is transformers' ``ntk_alpha`` (``HunYuanDenseV1RotaryEmbedding``):
  a fixed base theta * alpha ** (K / (K - 2)) that does not depend on the length, read as plain RoPE of that base;
  a ``dynamic`` scaling without ``alpha`` grows with the length and is read for accounting only;
* channel: a SwiGLU MLP (dense); Hunyuan-A13B on every layer ``num_experts`` experts of ``intermediate_size``
  (``moe_intermediate_size`` is not read by transformers), the top ``moe_topk`` of a softmax router (``gate.wg``)
  renormalised, plus a shared MLP of ``intermediate_size`` (``shared_mlp``) added unweighted; ``num_experts`` and
  ``moe_topk`` may be one per layer;
* pre-norm RMSNorms (eps ``rms_norm_eps``, 1e-5); untied embeddings by default.

The remote ``hunyuan`` type names the same layer differently: experts when ``num_experts`` > 1 (else the dense MLP),
each of ``intermediate_size`` (its ``moe_intermediate_size`` list is not read by its modeling file either), the shared
MLP only with ``use_mixed_mlp_moe``, of ``intermediate_size`` x ``num_shared_expert`` (an integer or one per layer,
the first used, as its modeling file does), q/k norms only with ``use_qk_norm`` (default false); head_dim is
hidden / heads (``attention_head_dim`` is not read by it). Refused by name: ``use_cla`` (cross-layer attention,
arXiv 2405.12981: every ``cla_share_factor``-th layer's keys and values reused by the next, no store for the sharing)
and ``use_mla``. Its experts are stored per expert (``mlp.experts.j.gate_proj``), read like the 3-D form.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D + 2K, the MLP's 3*D*I or the experts' E*3*D*I + E*D
router + the shared 3*D*I; the state is the keys and values. Names: transformers' usual ones, with
``self_attn.query_layernorm`` / ``key_layernorm``, ``mlp.gate.wg``, ``mlp.experts`` (3-D), ``mlp.shared_mlp``.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, model_config
from storelab.checkpoint.families._family import ORACLE, Family
from storelab.checkpoint.families._reader import RUNS_ROPE, Decl, Fields, _attention, rope_of, text_fields, tied
from storelab.checkpoint.table import copy

__all__ = ["FAMILY"]

DENSE, MOE, REMOTE = ("hunyuan_v1_dense",), ("hunyuan_v1_moe",), ("hunyuan",)
DECL = Decl(name="hunyuan", model_types=DENSE + MOE + REMOTE, title="Hunyuan (checkpoint)", qk_norm=True, eps=1e-5)


def _ntk_alpha(t: Fields) -> float | None:
    """``alpha`` of a ``dynamic`` scaling (transformers' fixed ``ntk_alpha`` base), else None."""
    rp = rope_of(t)
    if rp.kind == "dynamic" and rp.scaling and rp.scaling.get("alpha") is not None:
        key = "rope_scaling" if t.has("rope_scaling") else "rope_parameters"
        return t.sub(key).float("alpha", positive=True)
    return None


def hunyuan_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float, *, qk_norm: bool = True):
    a = dataclasses.replace(_attention(t, i, kind, decl, D, eps), qk_norm=qk_norm,
                            qk_norm_scope="head_after_rope" if qk_norm else "head")
    alpha = _ntk_alpha(t)
    if alpha is not None:
        K = a.head_dim
        a = dataclasses.replace(a, rope_theta=a.rope_theta * alpha ** (K / (K - 2)), rope_scaling=None)
    return a


def _per_layer(t: Fields, key: str, n: int, default: int) -> list[int]:
    """An integer, or one per layer (Hunyuan-A13B's ``moe_topk``), as a list of n."""
    if isinstance(t.d.get(key), list):
        v = t.list(key, n=n)
        for j, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise t._err(f"{key}[{j}]", f"must be an integer >= 1, got {x!r}")
        return v
    return [t.int(key, default=default, minimum=1)] * n


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig

    t = text_fields(hf)
    D, n = t.int("hidden_size", minimum=1), t.int("num_hidden_layers", minimum=1)
    eps = t.float("rms_norm_eps", default=1e-5, positive=True)
    if t.str("hidden_act", default="silu") not in ("silu", "swish"):
        raise t._err("hidden_act", f"{t.str('hidden_act')!r} is not supported (Hunyuan's MLPs are SiLU-gated)")
    I = t.int("intermediate_size", minimum=1)
    kind = Fields(hf).str("model_type")
    remote = kind in REMOTE
    if remote:
        for key in ("use_cla", "use_mla"):
            if t.bool(key, default=False):
                raise t._err(key, "true is not supported (cross-layer key/value sharing and MLA have no Hunyuan "
                                  "store here)")
    moe = kind in MOE or (remote and _per_layer(t, "num_experts", n, 1)[0] > 1)
    experts, topk = (_per_layer(t, "num_experts", n, 1), _per_layer(t, "moe_topk", n, 1)) if moe else ([], [])
    shared = 1
    if remote:  # the shared MLP only with use_mixed_mlp_moe, num_shared_expert[0] times as wide
        shared = _per_layer(t, "num_shared_expert", n, 1)[0] if t.bool("use_mixed_mlp_moe", default=False) else 0
    qk = t.bool("use_qk_norm", default=False) if remote else True
    layers = []
    for i in range(n):
        channel = (MoEConfig(d_model=D, n_experts=experts[i], top_k=topk[i], d_expert=I, router="softmax",
                             norm_topk_prob=True, n_shared=1 if shared else 0, d_shared=I * shared or None,
                             norm_eps=eps) if moe
                   else FFNConfig(d_model=D, d_ff=I))
        layers.append(LayerConfig(token=hunyuan_attention(t, i, _reader.FULL, DECL, D, eps, qk_norm=qk),
                                  channel=channel, depth=ResidualConfig(d_model=D)))
    cfg = model_config(hf, t.d, name=Fields(hf).str("model_type").replace("_", "-"), title=DECL.title, d_model=D,
                       layers=layers, norm_eps=eps, context=t.int("max_position_embeddings", default=0))
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t), vocab_size=t.int("vocab_size", minimum=1))


def table(hf: dict, cfg, names: set[str]) -> dict:
    """The reader's names, with Hunyuan's q/k norms and router."""
    tab = _reader.table(DECL, hf, cfg, names)
    pre = layer_prefix(names)[0]
    for i, lay in enumerate(cfg.layers):
        a, b = f"{pre}layers.{i}", f"blocks.{i}"
        if lay.token.qk_norm:
            tab[f"{b}.token.q_norm.weight"] = copy(f"{a}.self_attn.query_layernorm.weight")
            tab[f"{b}.token.k_norm.weight"] = copy(f"{a}.self_attn.key_layernorm.weight")
        if lay.channel.KIND == "moe":
            tab[f"{b}.channel.router.weight"] = copy(f"{a}.mlp.gate.wg.weight")
    return tab


def runs(hf: dict) -> None:
    t = text_fields(hf)
    rp = rope_of(t)
    if rp.kind not in RUNS_ROPE and _ntk_alpha(t) is None:
        key = "rope_scaling" if t.has("rope_scaling") else "rope_parameters"
        raise t._err(f"{key}.rope_type", f"{rp.kind!r} without alpha: storelab's attention runs {', '.join(RUNS_ROPE)} "
                                         "and Hunyuan's fixed ntk_alpha base only (accounting reads it)")


FAMILY = Family(stores=("attention", "ffn", "moe", "residual"), name="hunyuan", model_types=DECL.model_types,
                to_config=to_config, table=table, ignored=lambda hf: DECL.ignored, runs=runs,
                oracle=ORACLE + "; the remote hunyuan type: the same tiny model saved under its field names, experts "
                                "per expert (logits, counts); Hunyuan-A13B counted against its 80B / 13B")
