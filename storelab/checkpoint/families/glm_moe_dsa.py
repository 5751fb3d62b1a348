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

from storelab.checkpoint.families._common import (layer_prefix, model_config,
                                                  base_entries, beyond_layers, check_act, field, gated_mlp, linear,
                                                  mla_entries, rope, routed_moe, share_schedule, submodule_path,
                                                  unsupported)
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.table import copy

NAME = "glm_moe_dsa"
MODEL_TYPES = ("glm_moe_dsa", "deepseek_v32")  # DeepSeek-V3.2: the same layers, its indexer on every layer


def ignored(hf: dict) -> tuple[str, ...]:
    return (beyond_layers(field(hf, "num_hidden_layers")), r"rotary_emb\.")


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.dsa import DSAConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig

    check_act(hf)
    if field(hf, "attention_bias", False):
        raise unsupported("attention_bias", True, "our MLA projections have no biases")
    n, D = field(hf, "num_hidden_layers"), field(hf, "hidden_size")
    theta, _ = rope(field(hf, "rope_parameters", {}))
    types = field(hf, "indexer_types", None)
    if types is None and hf.get("index_topk_pattern") is not None:
        pat = hf["index_topk_pattern"]
        types = [{"F": "full", "S": "shared"}[c] for c in pat] if isinstance(pat, str) else list(pat)
    if types is None:  # GlmMoeDsaConfig's schedule: freq index_topk_freq (1), offset index_skip_topk_offset (2)
        freq, offset = max(hf.get("index_topk_freq") or 1, 1), hf.get("index_skip_topk_offset", 2)
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    sched = share_schedule(types)
    if sched is None:
        raise unsupported("indexer_types", types, "no IndexShare schedule (freq, offset) reproduces it")
    freq, offset = sched
    k_dense = min(field(hf, "first_k_dense_replace", 3), n)
    mlp_types = field(hf, "mlp_layer_types", None) or ["dense"] * k_dense + ["sparse"] * (n - k_dense)
    layers, last_full = [], None
    for i in range(n):
        token = DSAConfig(d_model=D, n_heads=field(hf, "num_attention_heads"), kv_lora_rank=field(hf, "kv_lora_rank"),
                          qk_nope_head_dim=field(hf, "qk_nope_head_dim"),
                          qk_rope_head_dim=field(hf, "qk_rope_head_dim"),
                          v_head_dim=field(hf, "v_head_dim"), q_lora_rank=field(hf, "q_lora_rank", None),
                          rope_theta=theta, rope_interleaved=True, norm_eps=1e-6,
                          index_n_heads=field(hf, "index_n_heads"), index_head_dim=field(hf, "index_head_dim"),
                          # DeepSeek-V3.2's indexer rotates half-split pairs, GLM's interleaved ones
                          index_rope_interleaved=hf.get("model_type") != "deepseek_v32",
                          index_topk=field(hf, "index_topk"),
                          index_share_freq=freq, index_share_offset=offset, layer_index=i)
        if token.runs_indexer:
            last_full = i
        if mlp_types[i] == "dense":
            channel = FFNConfig(d_model=D, d_ff=field(hf, "intermediate_size"))
        else:
            channel = MoEConfig(d_model=D, n_experts=field(hf, "n_routed_experts"),
                                top_k=field(hf, "num_experts_per_tok"),
                                d_expert=field(hf, "moe_intermediate_size"), router="sigmoid", router_bias=True,
                                norm_topk_prob=bool(field(hf, "norm_topk_prob", True)),
                                routed_scaling=float(field(hf, "routed_scaling_factor", 1.0)),
                                n_shared=field(hf, "n_shared_experts", 0), d_shared=field(hf, "moe_intermediate_size"),
                                n_group=field(hf, "n_group", 1), topk_group=field(hf, "topk_group", field(hf, "n_group", 1)))
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D),
                                  selection_owner=None if token.runs_indexer else last_full))
    return model_config(hf, hf, name="glm-moe-dsa", title="GLM-MoE-DSA (checkpoint)", d_model=D, layers=layers,
                        norm_eps=field(hf, "rms_norm_eps", 1e-5))


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
