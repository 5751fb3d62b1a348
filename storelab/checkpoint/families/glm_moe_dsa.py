"""GLM-MoE-DSA (GLM-5, arXiv 2602.15763): MLA read through DeepSeek Sparse Attention with
IndexShare, dense layers first, then MoE with sigmoid routing, a choice bias and shared experts.

| ours                                   | transformers (``GlmMoeDsaForCausalLM``)          |
|----------------------------------------|--------------------------------------------------|
| embed.weight                           | model.embed_tokens.weight                        |
| blocks.i.norm_token / norm_channel     | model.layers.i.input_layernorm / post_attention_layernorm |
| blocks.i.token.mla.q_down / q_norm / q_up | model.layers.i.self_attn.q_a_proj / q_a_layernorm / q_b_proj |
| blocks.i.token.mla.kv_down / kv_norm / kv_up | model.layers.i.self_attn.kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj |
| blocks.i.token.mla.out                 | model.layers.i.self_attn.o_proj                  |
| blocks.i.token.<indexer>.q_up / k_proj / k_norm / head_weights | model.layers.i.self_attn.indexer.wq_b / wk / k_norm / weights_proj |
| blocks.i.channel.{gate,up,down}_proj   | model.layers.i.mlp.{gate,up,down}_proj (dense)   |
| blocks.i.channel.router / choice_bias  | model.layers.i.mlp.gate.weight / .e_score_correction_bias |
| blocks.i.channel.gate_up / down        | model.layers.i.mlp.experts.* (3-D or per expert) |
| blocks.i.channel.shared_{gate,up,down}_proj | model.layers.i.mlp.shared_experts.{gate,up,down}_proj |
| norm.weight, lm_head.weight            | model.norm.weight, lm_head.weight                |

``indexer_types`` ("full"/"shared" per layer) becomes our IndexShare schedule
(``index_share_freq``/``index_share_offset``); the MTP layer stored after the last decoder
layer (``model.layers.<n>``) is ignored. Both RoPEs (MLA and indexer) are interleaved.
"""

from __future__ import annotations

from storelab.checkpoint.families._common import (model_config, base_entries, beyond_layers, gated_mlp, linear,
                                                  mla_entries, routed_moe, share_schedule, submodule_path,
                                                  unsupported)
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Fields
from storelab.checkpoint.table import copy

NAME = "glm_moe_dsa"
MODEL_TYPES = ("glm_moe_dsa", "deepseek_v32")  # DeepSeek-V3.2: the same layers, its indexer on every layer


def ignored(hf: dict) -> tuple[str, ...]:
    return (beyond_layers(Fields(hf).int("num_hidden_layers", minimum=1)), r"rotary_emb\.")


def indexer_types(t: Fields, n: int) -> list[str]:
    """"full" or "shared" per layer: ``indexer_types``; else ``index_topk_pattern`` ("FSS..." or a list);
    else GlmMoeDsaConfig's schedule, every ``index_topk_freq``-th layer (1) from ``index_skip_topk_offset`` (2)."""
    if t.has("indexer_types"):
        key, types = "indexer_types", t.list("indexer_types", n=n)
    elif t.has("index_topk_pattern"):
        key, pat = "index_topk_pattern", t.raw("index_topk_pattern")
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pat] if isinstance(pat, str) else \
            t.list("index_topk_pattern", n=n)
        types = types[:n]
        if len(types) < n:
            raise t._err(key, f"has {len(types)} entries, but num_hidden_layers is {n} (one entry per layer)")
    else:
        freq = t.int("index_topk_freq", default=1, minimum=1)
        offset = t.int("index_skip_topk_offset", default=2)
        return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    for i, x in enumerate(types):
        if x not in ("full", "shared"):
            raise t._err(f"{key}[{i}]", f"must be 'full' or 'shared' ('F' or 'S'), got {x!r}")
    return types


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.dsa import DSAConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig

    t = Fields(hf)
    act = t.str("hidden_act", default="silu")
    if act != "silu":
        raise t._err("hidden_act", f"{act!r} is not supported (only silu is implemented for this family)")
    if t.bool("attention_bias", default=False):
        raise t._err("attention_bias", "true is not supported (our MLA projections have no biases)")
    n, D = t.int("num_hidden_layers", minimum=1), t.int("hidden_size", minimum=1)
    rp = t.sub("rope_parameters", default={})
    kind = rp.str("rope_type", "type", default="default")
    if kind != "default":
        raise rp._err("rope_type", f"{kind!r} is not supported (only plain RoPE is implemented)")
    theta = rp.float("rope_theta", default=10000.0, positive=True)
    types = indexer_types(t, n)
    sched = share_schedule(types)
    if sched is None:
        raise unsupported("indexer_types", types, "no IndexShare schedule (freq, offset) reproduces it")
    freq, offset = sched
    if t.has("mlp_layer_types"):
        mlp_types = t.list("mlp_layer_types", n=n)
    else:
        k_dense = min(t.int("first_k_dense_replace", default=3), n)
        mlp_types = ["dense"] * k_dense + ["sparse"] * (n - k_dense)
    n_group = t.int("n_group", default=1, minimum=1)
    layers, last_full = [], None
    for i in range(n):
        token = DSAConfig(d_model=D, n_heads=t.int("num_attention_heads", minimum=1),
                          kv_lora_rank=t.int("kv_lora_rank", minimum=1),
                          qk_nope_head_dim=t.int("qk_nope_head_dim", minimum=1),
                          qk_rope_head_dim=t.int("qk_rope_head_dim"),
                          v_head_dim=t.int("v_head_dim", minimum=1),
                          q_lora_rank=t.int("q_lora_rank", default=None, minimum=1),
                          rope_theta=theta, rope_interleaved=True, norm_eps=1e-6,
                          index_n_heads=t.int("index_n_heads", minimum=1),
                          index_head_dim=t.int("index_head_dim", minimum=1),
                          # DeepSeek-V3.2's indexer rotates half-split pairs, GLM's interleaved ones
                          index_rope_interleaved=hf.get("model_type") != "deepseek_v32",
                          index_topk=t.int("index_topk", minimum=1),
                          index_share_freq=freq, index_share_offset=offset, layer_index=i)
        if token.runs_indexer:
            last_full = i
        if mlp_types[i] == "dense":
            channel = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", minimum=1))
        else:
            channel = MoEConfig(d_model=D, n_experts=t.int("n_routed_experts", minimum=1),
                                top_k=t.int("num_experts_per_tok", minimum=1),
                                d_expert=t.int("moe_intermediate_size", minimum=1), router="sigmoid",
                                router_bias=True, norm_topk_prob=t.bool("norm_topk_prob", default=True),
                                routed_scaling=t.float("routed_scaling_factor", default=1.0, positive=True),
                                n_shared=t.int("n_shared_experts", default=0),
                                d_shared=t.int("moe_intermediate_size"),
                                n_group=n_group, topk_group=t.int("topk_group", default=n_group, minimum=1))
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D),
                                  selection_owner=None if token.runs_indexer else last_full))
    return model_config(hf, t, name="glm-moe-dsa", title="GLM-MoE-DSA (checkpoint)", d_model=D, layers=layers,
                        norm_eps=t.float("rms_norm_eps", default=1e-5, positive=True))


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab: dict = {}
    base_entries(tab, cfg)
    for i, lay in enumerate(cfg.layers):
        a, o = f"model.layers.{i}.self_attn", f"blocks.{i}.token"
        mla_entries(tab, f"{o}.mla", a, lay.token)
        if lay.token.runs_indexer:
            x = f"{o}.{submodule_path(lay.token, 'LightningIndexer')}"
            linear(tab, f"{x}.q_up", f"{a}.indexer.wq_b")
            linear(tab, f"{x}.k_proj", f"{a}.indexer.wk")
            tab[f"{x}.k_norm.weight"] = copy(f"{a}.indexer.k_norm.weight")
            tab[f"{x}.k_norm.bias"] = copy(f"{a}.indexer.k_norm.bias")
            linear(tab, f"{x}.head_weights", f"{a}.indexer.weights_proj")
        m, c = f"model.layers.{i}.mlp", f"blocks.{i}.channel"
        if lay.channel.KIND == "ffn":
            gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), m, names, lay.channel.d_ff)
        else:
            routed_moe(tab, c, m, names, lay.channel)
    return tab


FAMILY = Family(stores=("dsa", "ffn", "moe", "residual"),
                name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=table, ignored=ignored)
