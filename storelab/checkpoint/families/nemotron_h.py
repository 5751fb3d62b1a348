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

An MLP with no mixer before it, and the experts of Nemotron 3 (non-gated ReLU^2 units, which storelab's moe
store does not run yet), are refused naming the layer.
"""

from __future__ import annotations

from storelab.checkpoint.families._common import linear, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import text_fields
from storelab.checkpoint.families.mamba import mamba2_store, mixer_entries, tied_default, time_step_limit
from storelab.checkpoint.table import copy

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
            if types[j + 1] == "moe":
                raise t._err(f"layers_block_type[{j + 1}]", "'moe': Nemotron's experts are non-gated ReLU^2 units, "
                                                            "which storelab's moe store does not run yet")
            out.append((j, j + 1))
            j += 2
        else:
            out.append((j, None))
            j += 1
    return out


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    t = text_fields(hf)
    D = t.int("hidden_size", minimum=1)
    eps = t.float("layer_norm_epsilon", "rms_norm_eps", default=1e-5)
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
        channel = None if k is None else FFNConfig(d_model=D, d_ff=t.int("intermediate_size", minimum=1),
                                                   activation="relu2", bias=t.bool("mlp_bias", default=False))
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
            tab[f"blocks.{i}.norm_channel.weight"] = copy(f"backbone.layers.{k}.norm.weight")
            for p in ("up_proj", "down_proj"):
                linear(tab, f"blocks.{i}.channel.{p}", f"backbone.layers.{k}.mixer.{p}", bias=lay.channel.bias)
    return tab


FAMILY = Family(name="nemotron_h", model_types=("nemotron_h",), to_config=to_config, table=table,
                ignored=lambda hf: (r"rotary_emb\.", r"^mtp\.", r"^model\.mtp\."))
