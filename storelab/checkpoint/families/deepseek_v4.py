"""DeepSeek-V4 (arXiv 2606.19348; V4-Pro's family): CSA and HCA compressed attention,
mHC depth streams (arXiv 2512.24880), MoE with sqrt-softplus routing, hash routing in the
first layers, and clamped SwiGLU experts.

| ours                                   | checkpoint (DeepSeek's names; transformers saves them so) |
|----------------------------------------|--------------------------------------------------|
| embed.weight, lm_head.weight, norm.weight | [model.]embed_tokens / embed, head, [model.]norm |
| depth_head.{weight,bias,scale}         | model.hc_head.hc_{fn,base,scale} (or hc_head_{fn,base,scale}) |
| blocks.i.depth_token / depth_channel.{weight,bias,scale} | layers.i.hc_attn_{fn,base,scale} / hc_ffn_{...} |
| blocks.i.norm_token / norm_channel     | layers.i.attn_norm / ffn_norm                    |
| blocks.i.token.q_a, q_a_norm, q_b      | layers.i.attn.wq_a, q_norm, wq_b                 |
| blocks.i.token.kv_proj, kv_norm        | layers.i.attn.wkv, norm (the release: kv_norm)   |
| blocks.i.token.o_a [g, r, H*C/g], o_b  | layers.i.attn.wo_a [g*r, H*C/g], wo_b            |
| blocks.i.token.sinks                   | layers.i.attn.attn_sink                          |
| blocks.i.token.pooler.{kv,score,bias,norm} | layers.i.attn.compressor.{wkv,wgate,ape,norm} (ape re-laid per series) |
| blocks.i.token.index_pooler.*, index_q, index_weights (csa) | layers.i.attn.indexer.compressor.*, indexer.wq_b, weights_proj |
| blocks.i.channel.router, choice_bias, table | layers.i.ffn.gate.weight, gate.bias, gate.tid2eid (hash layers) |
| blocks.i.channel.gate_up / down        | layers.i.ffn.experts.{e}.w1, w3 / w2             |
| blocks.i.channel.shared_{gate,up,down}_proj | layers.i.ffn.shared_experts.w1 / w3 / w2    |

Layers with compress rate 0 (``sliding_attention``) are ``v4_window`` stores: the same
projections, sinks and output, over the window alone, with the plain "main" RoPE at
``rope_theta`` (``rope_parameters.main``); they have no compressor tensors. The released
configs put YaRN (factor 16 from 65,536 tokens) on the compressed layers' RoPE
(``rope_scaling``, or ``rope_parameters.compress`` in transformers' form), which storelab's
compressed stores do not implement: such a config is accounted (``storelab models / memory
--checkpoint``) with plain RoPE at ``compress_rope_theta``, and ``runs`` refuses to load it
for running, naming the field. The MTP layers (``mtp.*``, ``layers.<n>``, the extra
``compress_ratios`` entry) are ignored.
"""

from __future__ import annotations

from storelab.checkpoint.families._common import (layer_prefix, model_config,
                                                  beyond_layers, check_act, either, experts, field, linear, rope,
                                                  unsupported)
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.table import Src, copy

NAME = "deepseek_v4"
MODEL_TYPES = ("deepseek_v4",)
KINDS = {"compressed_sparse_attention": "csa", "heavily_compressed_attention": "hca"}


def ignored(hf: dict) -> tuple[str, ...]:
    n = field(hf, "num_hidden_layers")
    return (r"^(model\.)?mtp\.", beyond_layers(n, r"^(?:model\.)?layers\."), r"rotary_emb\.")


RATIO_TO_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def normalized(hf: dict) -> dict:
    """The config with transformers' defaults and legacy keys resolved (``DeepseekV4Config.__post_init__``)."""
    hf = dict(hf)
    n = field(hf, "num_hidden_layers")
    rates = dict(hf.get("compress_rates") or {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128})
    if hf.get("compress_rate_csa") is not None:
        rates["compressed_sparse_attention"] = hf["compress_rate_csa"]
    if hf.get("compress_rate_hca") is not None:
        rates["heavily_compressed_attention"] = hf["compress_rate_hca"]
    hf["compress_rates"] = rates
    if hf.get("layer_types") is None and hf.get("compress_ratios") is not None:
        hf["layer_types"] = [RATIO_TO_TYPE[r] for r in hf["compress_ratios"]]
    if hf.get("layer_types") is None:
        hf["layer_types"] = (["heavily_compressed_attention"] * min(n, 2) +
                             ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
                              for i in range(max(n - 2, 0))])
    if hf.get("mlp_layer_types") is None:
        n_hash = hf.get("num_hash_layers", 3)
        hf["mlp_layer_types"] = ["hash_moe"] * min(n, n_hash) + ["moe"] * max(0, n - n_hash)
    if hf.get("partial_rotary_factor") is None:
        rope_dim = hf.get("qk_rope_head_dim")
        hf["partial_rotary_factor"] = rope_dim / field(hf, "head_dim") if rope_dim is not None else 64 / 512
    return hf


def _compress_rope(hf: dict) -> dict:
    """The compressed layers' rope parameters: transformers' ``rope_parameters.compress``, or the release's
    ``compress_rope_theta`` with its top-level scaling (``rope_scaling``; ``rope_parameters`` flat)."""
    rp = field(hf, "rope_parameters", {}) or {}
    if isinstance(rp.get("compress"), dict):
        return rp["compress"]
    scaling = hf.get("rope_scaling") or {k: v for k, v in rp.items() if k != "main"}
    return {**{k: v for k, v in scaling.items() if k != "rope_theta"},
            "rope_theta": field(hf, "compress_rope_theta", 160000.0),
            "partial_rotary_factor": normalized(hf)["partial_rotary_factor"]}


def runs(hf: dict) -> None:
    """A config whose compressed layers scale their RoPE (the releases' YaRN) is accounted, not run."""
    compress = _compress_rope(hf)
    kind = compress.get("rope_type", compress.get("type", "default"))
    if kind != "default":
        where = "rope_scaling.type" if hf.get("rope_scaling") else "rope_parameters.compress.rope_type"
        raise unsupported(where, kind, "the compressed layers' RoPE scaling is not implemented: this config is "
                          "accounted (storelab models / memory --checkpoint), not run")


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.compressed import CSAConfig, HCAConfig
    from storelab.stores.depth import MHCConfig
    from storelab.stores.moe import MoEConfig
    from storelab.stores.v4_window import V4WindowConfig

    hf = normalized(hf)
    check_act(hf)
    n, D = field(hf, "num_hidden_layers"), field(hf, "hidden_size")
    if field(hf, "attention_bias", False) or field(hf, "mlp_bias", False):
        raise unsupported("attention_bias", True, "DeepSeek-V4's projections have no biases")
    compress = _compress_rope(hf)
    theta, partial = rope({k: v for k, v in compress.items() if k not in ("rope_type", "type")},
                          where="rope_parameters.compress")  # its scaling: accounted, refused by runs()
    rp = field(hf, "rope_parameters", {}) or {}
    C = field(hf, "head_dim")
    eps = field(hf, "rms_norm_eps", 1e-6)
    rates = field(hf, "compress_rates")
    common = dict(d_model=D, n_heads=field(hf, "num_attention_heads"), head_dim=C, rope_dim=int(C * partial),
                  q_lora=field(hf, "q_lora_rank"), o_groups=field(hf, "o_groups"), o_lora=field(hf, "o_lora_rank"),
                  window=field(hf, "sliding_window"), rope_theta=theta, eps=eps)
    main = rp.get("main") or {"rope_theta": field(hf, "rope_theta", 10000.0)}
    main_theta, _ = rope(main, where="rope_parameters.main")
    if field(hf, "num_key_value_heads", 1) != 1:
        raise unsupported("num_key_value_heads", hf["num_key_value_heads"], "V4 attention has one shared KV head")
    depth = MHCConfig(d_model=D, n_streams=field(hf, "hc_mult"), sinkhorn_iters=field(hf, "hc_sinkhorn_iters"),
                      eps=field(hf, "hc_eps", 1e-6), norm_eps=eps)
    E, k = field(hf, "n_routed_experts"), field(hf, "num_experts_per_tok")
    moe = dict(d_model=D, n_experts=E, top_k=k, d_expert=field(hf, "moe_intermediate_size"),
               router=field(hf, "scoring_func", "sqrtsoftplus"), norm_topk_prob=True,
               routed_scaling=float(field(hf, "routed_scaling_factor", 1.0)), n_shared=1,
               d_shared=field(hf, "moe_intermediate_size"), swiglu_limit=field(hf, "swiglu_limit", None))
    layers = []
    for i in range(n):
        t = field(hf, "layer_types")[i]
        if t == "compressed_sparse_attention":
            s = rates[t]
            token = CSAConfig(pool=2 * s, stride=s, index_heads=field(hf, "index_n_heads"),
                              index_head_dim=field(hf, "index_head_dim"), index_topk=field(hf, "index_topk"), **common)
        elif t == "heavily_compressed_attention":
            token = HCAConfig(pool=rates[t], **common)
        elif t == "sliding_attention":
            token = V4WindowConfig(**{**common, "rope_theta": main_theta})
        else:
            raise unsupported(f"layer_types[{i}]", t, "DeepSeek-V4 has sliding_attention, compressed_sparse_attention "
                              "and heavily_compressed_attention")
        if field(hf, "mlp_layer_types")[i] == "hash_moe":
            channel = MoEConfig(routing="hash", vocab_size=field(hf, "vocab_size"), **moe)
        else:
            channel = MoEConfig(router_bias=True, **moe)
        layers.append(LayerConfig(token=token, channel=channel, depth=depth))
    return model_config(hf, hf, name="deepseek-v4", title="DeepSeek-V4 (checkpoint)", d_model=D, layers=layers,
                        norm_eps=eps)


def _ape(name: str, stride: int, series: int) -> Src:
    """theirs [stride, series * C] (slot within a stride block, then series) -> ours [series * stride, C]."""
    def relay(w):
        C = w.shape[-1] // series
        return w.reshape(stride, series, C).transpose(0, 1).reshape(series * stride, C)

    return Src((name,), relay, f"ape [stride {stride}, {series} x C] re-laid as [{series} x {stride}, C]")


def _pooler(tab: dict, ours: str, theirs: str, stride: int, series: int) -> None:
    linear(tab, f"{ours}.kv", f"{theirs}.wkv")
    linear(tab, f"{ours}.score", f"{theirs}.wgate")
    tab[f"{ours}.bias"] = _ape(f"{theirs}.ape", stride, series)
    tab[f"{ours}.norm.weight"] = copy(f"{theirs}.norm.weight")


def table(hf: dict, cfg, names: set[str]) -> dict:
    from storelab.stores.v4_window import V4WindowConfig

    pre = "model." if "model.layers.0.attn_norm.weight" in names else ""
    tab: dict = {"embed.weight": copy(either(names, f"{pre}embed_tokens.weight", "embed.weight")),
                 "norm.weight": copy(f"{pre}norm.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy(either(names, "head.weight", "lm_head.weight"))
    for p, q in (("weight", "fn"), ("bias", "base"), ("scale", "scale")):
        tab[f"depth_head.{p}"] = copy(either(names, f"{pre}hc_head.hc_{q}", f"hc_head_{q}"))
    for i, lay in enumerate(cfg.layers):
        L, b, tok = f"{pre}layers.{i}", f"blocks.{i}", lay.token
        for p, q in (("weight", "fn"), ("bias", "base"), ("scale", "scale")):
            tab[f"{b}.depth_token.{p}"] = copy(f"{L}.hc_attn_{q}")
            tab[f"{b}.depth_channel.{p}"] = copy(f"{L}.hc_ffn_{q}")
        tab[f"{b}.norm_token.weight"] = copy(f"{L}.attn_norm.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{L}.ffn_norm.weight")
        a, o = f"{L}.attn", f"{b}.token"
        for ours, theirs in (("q_a", "wq_a"), ("q_b", "wq_b"), ("kv_proj", "wkv"), ("o_b", "wo_b")):
            linear(tab, f"{o}.{ours}", f"{a}.{theirs}")
        tab[f"{o}.q_a_norm.weight"] = copy(f"{a}.q_norm.weight")
        tab[f"{o}.kv_norm.weight"] = copy(either(names, f"{a}.norm.weight", f"{a}.kv_norm.weight"))  # release: kv_norm
        g, r = tok.o_groups, tok.o_lora
        tab[f"{o}.o_a"] = Src((f"{a}.wo_a.weight",), lambda w, g=g, r=r: w.reshape(g, r, -1), "[g*r, .] -> [g, r, .]")
        tab[f"{o}.sinks"] = copy(f"{a}.attn_sink")
        if not isinstance(tok, V4WindowConfig):  # a window-only layer has no compressor
            _pooler(tab, f"{o}.pooler", f"{a}.compressor", tok.stride, tok.series)
        if tok.KIND == "csa":
            _pooler(tab, f"{o}.index_pooler", f"{a}.indexer.compressor", tok.stride, tok.series)
            linear(tab, f"{o}.index_q", f"{a}.indexer.wq_b")
            linear(tab, f"{o}.index_weights", f"{a}.indexer.weights_proj")
        f, c, ch = f"{L}.ffn", f"{b}.channel", lay.channel
        tab[f"{c}.router.weight"] = copy(f"{f}.gate.weight")
        if ch.routing == "hash":
            tab[f"{c}.table"] = copy(f"{f}.gate.tid2eid", integer=True)
        else:
            tab[f"{c}.choice_bias"] = copy(either(names, f"{f}.gate.bias", f"{f}.gate.e_score_correction_bias"))
        experts(tab, c, f"{f}.experts", names, ch.n_experts)
        for ours, theirs in (("shared_gate_proj", "w1"), ("shared_up_proj", "w3"), ("shared_down_proj", "w2")):
            linear(tab, f"{c}.{ours}", f"{f}.shared_experts.{theirs}")
    return tab


FAMILY = Family(stores=("csa", "hca", "v4_window", "moe", "mhc"),
                name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=table, ignored=ignored, runs=runs)
