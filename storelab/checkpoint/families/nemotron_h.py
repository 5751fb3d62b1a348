"""Nemotron-H (NVIDIA, arXiv 2504.03624) and the Nemotron Nano 2 / Nemotron 3 line: a stack of single-mixer
layers, each an RMSNorm, one mixer and the residual. The mixer is Mamba-2 ("M", ``linear_attention``),
attention without positions ("*", ``full_attention``: GQA, no RoPE), a ReLU^2 MLP ("-", ``mlp``) or experts
("E", ``moe``). The layer list is read from its published forms: the remote-code
``hybrid_override_pattern`` string, ``layers_block_type`` (NAS-pruned models list their own), or v5's
``layer_types``.

Our layers have a token slot and a channel slot, so consecutive (mixer, MLP) pairs of the published
stack become one of our layers, and a mixer followed by another mixer a layer with no channel mixer.
Published layer j maps to ours as:

| ours                                  | transformers (``NemotronHForCausalLM``)          |
|---------------------------------------|--------------------------------------------------|
| embed.weight, norm.weight, lm_head    | backbone.embeddings, backbone.norm_f, lm_head    |
| blocks.k.norm_token / norm_channel    | backbone.layers.j.norm / backbone.layers.j+1.norm |
| blocks.k.token.* (mamba2)             | backbone.layers.j.mixer.* (Mamba2Mixer names)    |
| blocks.k.token.{q,k,v,o}_proj         | backbone.layers.j.mixer.{q,k,v,o}_proj           |
| blocks.k.channel.{up,down}_proj       | backbone.layers.j+1.mixer.{up,down}_proj          |

Nemotron 3's experts ("E") are the moe store with plain ReLU^2 units (``gate_up`` holds the up rows only),
sigmoid routing with the choice bias, one shared ReLU^2 expert and Super's latent projection (no norm). An MLP
with no mixer before it is refused naming the layer.
"""

from __future__ import annotations

import torch

from storelab.checkpoint.families._common import linear, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import text_fields
from storelab.checkpoint.families.mamba import mamba2_store, mixer_entries, tied_default, time_step_limit
from storelab.checkpoint.table import Src, copy

CODES = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
TOKEN_TYPES = ("linear_attention", "full_attention", "mamba", "attention")


def block_types(t) -> list[str]:
    if t.has("hybrid_override_pattern"):
        pat = t.str("hybrid_override_pattern")
        bad = next((c for c in pat if c not in CODES), None)
        if bad is not None:
            raise t._err("hybrid_override_pattern", f"unknown layer code {bad!r} (known: {', '.join(CODES)})")
        return [CODES[c] for c in pat]
    types = t.list("layers_block_type", "layer_types")
    for j, x in enumerate(types):
        if x not in (*CODES.values(), "mamba", "attention"):
            raise t._err(f"layers_block_type[{j}]", f"unknown layer type {x!r}")
    return types


def pairs(t) -> list[tuple[int, int | None]]:
    """(published index of the mixer, of the MLP after it or None) per layer of ours."""
    types, out, j = block_types(t), [], 0
    while j < len(types):
        if types[j] not in TOKEN_TYPES:
            raise t._err(f"layers_block_type[{j}]", f"{types[j]!r} with no mixer before it: storelab's layers "
                                                    "need a token mixer (not supported yet)")
        if j + 1 < len(types) and types[j + 1] not in TOKEN_TYPES:
            out.append((j, j + 1))
            j += 2
        else:
            out.append((j, None))
            j += 1
    return out


def experts(t, D: int, eps: float):
    """Nemotron 3's experts: ReLU^2 units (up and down only) chosen by sigmoid scores plus the choice bias among the
    ``topk_group`` best of ``n_group`` groups, one shared ReLU^2 expert, and (Super) a latent projection without a
    norm (``moe_latent_size``)."""
    from storelab.stores.moe import MoEConfig

    if t.bool("mlp_bias", default=False):
        raise t._err("mlp_bias", "true is not supported for Nemotron's experts (storelab's moe has no bias there)")
    shared = t.int("moe_shared_expert_intermediate_size", default=0)
    return MoEConfig(d_model=D, n_experts=t.int("n_routed_experts", "num_local_experts", minimum=1),
                     top_k=t.int("num_experts_per_tok", minimum=1), d_expert=t.int("moe_intermediate_size", minimum=1),
                     router="sigmoid", router_bias=True, norm_topk_prob=t.bool("norm_topk_prob", default=True),
                     routed_scaling=t.float("routed_scaling_factor", default=1.0, positive=True),
                     n_group=t.int("n_group", default=1, minimum=1), topk_group=t.int("topk_group", default=1, minimum=1),
                     n_shared=t.int("n_shared_experts", default=1) if shared else 0, d_shared=shared or None,
                     latent_dim=t.int("moe_latent_size", default=None, minimum=1), latent_norm=False,
                     activation="relu2", norm_eps=eps)


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    t = text_fields(hf)
    D = t.int("hidden_size", minimum=1)
    eps = t.float("layer_norm_epsilon", "rms_norm_eps", default=1e-5, positive=True)
    if t.str("mlp_hidden_act", default="relu2") != "relu2":
        raise t._err("mlp_hidden_act", f"{t.str('mlp_hidden_act')!r} is not supported (Nemotron-H's MLP is ReLU^2)")
    lim = time_step_limit(t)
    mamba = mamba2_store(t, D, heads="mamba_num_heads", head_dim="mamba_head_dim",
                         dt_limit=(max(lim[0], t.float("time_step_min", default=0.0)), lim[1]))
    types = block_types(t)
    layers = []
    for j, k in pairs(t):
        if types[j] in ("linear_attention", "mamba"):
            token = mamba
        else:
            H = t.int("num_attention_heads", minimum=1)
            token = AttentionConfig(d_model=D, n_heads=H, n_kv_heads=t.int("num_key_value_heads", minimum=1),
                                    head_dim=t.int("head_dim", "attention_head_dim", default=D // H, minimum=1),
                                    partial_rotary=0.0, qkv_bias=t.bool("attention_bias", default=False),
                                    out_bias=t.bool("attention_bias", default=False), norm_eps=eps)
        if k is None:
            channel = None
        elif types[k] == "moe":
            channel = experts(t, D, eps)
        else:
            channel = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", minimum=1), activation="relu2",
                                bias=t.bool("mlp_bias", default=False))
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D)))
    import dataclasses

    cfg = model_config(hf, t.d, name="nemotron-h", title="Nemotron-H (checkpoint)", d_model=D, layers=layers,
                       norm_eps=eps, context=t.int("max_position_embeddings", default=0))
    return dataclasses.replace(cfg, tie_embeddings=tied_default(hf, t, False))


def table(hf: dict, cfg, names: set[str]) -> dict:
    t = text_fields(hf)
    tab: dict = {"embed.weight": copy("backbone.embeddings.weight"), "norm.weight": copy("backbone.norm_f.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("lm_head.weight")
    for i, ((j, k), lay) in enumerate(zip(pairs(t), cfg.layers)):
        o, m = f"blocks.{i}.token", f"backbone.layers.{j}.mixer"
        tab[f"blocks.{i}.norm_token.weight"] = copy(f"backbone.layers.{j}.norm.weight")
        if lay.token.KIND == "mamba2":
            mixer_entries(tab, o, m, lay.token)
        else:
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                linear(tab, f"{o}.{p}", f"{m}.{p}", bias=lay.token.qkv_bias)
        if k is not None:
            c, m = f"blocks.{i}.channel", f"backbone.layers.{k}.mixer"
            tab[f"blocks.{i}.norm_channel.weight"] = copy(f"backbone.layers.{k}.norm.weight")
            if lay.channel.KIND == "ffn":
                for p in ("up_proj", "down_proj"):
                    linear(tab, f"{c}.{p}", f"{m}.{p}", bias=lay.channel.bias)
                continue
            tab[f"{c}.router.weight"] = copy(f"{m}.gate.weight")
            tab[f"{c}.choice_bias"] = copy(f"{m}.gate.e_score_correction_bias")
            E = lay.channel.n_experts
            for ours, theirs in (("gate_up", "up_proj"), ("down", "down_proj")):  # gate_up: the up rows only
                if f"{m}.experts.{theirs}" in names:   # transformers' 3-D layout
                    tab[f"{c}.{ours}"] = copy(f"{m}.experts.{theirs}")
                else:                                  # the published per-expert matrices, stacked
                    tab[f"{c}.{ours}"] = Src(tuple(f"{m}.experts.{e}.{theirs}.weight" for e in range(E)),
                                             lambda *ws: torch.stack(ws, 0), f"per-expert {theirs} stacked ({E})")
            if lay.channel.shared_width:
                linear(tab, f"{c}.shared_up_proj", f"{m}.shared_experts.up_proj")
                linear(tab, f"{c}.shared_down_proj", f"{m}.shared_experts.down_proj")
            if lay.channel.latent_dim is not None:
                linear(tab, f"{c}.latent_down", f"{m}.fc1_latent_proj")
                linear(tab, f"{c}.latent_up", f"{m}.fc2_latent_proj")
    return tab


FAMILY = Family(stores=("mamba2", "attention", "ffn", "moe", "residual"),
                name="nemotron_h", model_types=("nemotron_h",), to_config=to_config, table=table,
                ignored=lambda hf: (r"rotary_emb\.", r"^mtp\.", r"^model\.mtp\."))
