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

from storelab.checkpoint.families._common import model_config, beyond_layers, either, experts, linear, unsupported
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Fields, scaling_numbers
from storelab.checkpoint.table import Src, copy

NAME = "deepseek_v4"
MODEL_TYPES = ("deepseek_v4",)
KINDS = {"compressed_sparse_attention": "csa", "heavily_compressed_attention": "hca"}


def ignored(hf: dict) -> tuple[str, ...]:
    n = Fields(hf).int("num_hidden_layers", minimum=1)
    return (r"^(model\.)?mtp\.", beyond_layers(n, r"^(?:model\.)?layers\."), r"rotary_emb\.")


RATIO_TO_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
TYPES = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")


def compress_rates(t: Fields) -> dict[str, int]:
    """Each compressed kind's rate: ``compress_rates``, the release's ``compress_rate_csa`` / ``_hca``,
    else transformers' defaults (4 and 128)."""
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    if t.has("compress_rates"):
        given = t.sub("compress_rates")
        rates.update({k: given.int(k, minimum=1) for k in given.d if k in rates})
    for kind, key in (("compressed_sparse_attention", "compress_rate_csa"),
                      ("heavily_compressed_attention", "compress_rate_hca")):
        if t.has(key):
            rates[kind] = t.int(key, minimum=1)
    return rates


def token_types(t: Fields, n: int) -> list[str]:
    """``layer_types``; else the release's ``compress_ratios`` (0 a window, 4 CSA, 128 HCA); else
    transformers' default (two HCA layers, then CSA and HCA in turn)."""
    if t.has("layer_types"):
        key, types = "layer_types", t.list("layer_types", n=n)
    elif t.has("compress_ratios"):
        key, types = "compress_ratios", []
        for i, r in enumerate(t.list("compress_ratios", n=n)):
            if isinstance(r, bool) or r not in RATIO_TO_TYPE:
                raise t._err(f"compress_ratios[{i}]", f"must be one of {', '.join(map(str, RATIO_TO_TYPE))}, got {r!r}")
            types.append(RATIO_TO_TYPE[r])
    else:
        return (["heavily_compressed_attention"] * min(n, 2) +
                ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(n - 2)])
    for i, x in enumerate(types):
        if x not in TYPES:
            raise t._err(f"{key}[{i}]", f"{x!r} is not supported (DeepSeek-V4 has {', '.join(TYPES)})")
    return types


def channel_types(t: Fields, n: int) -> list[str]:
    """``mlp_layer_types``; else the first ``num_hash_layers`` (3) hash-routed, the rest routed by score."""
    if t.has("mlp_layer_types"):
        return t.list("mlp_layer_types", n=n)
    n_hash = t.int("num_hash_layers", default=3)
    return ["hash_moe"] * min(n, n_hash) + ["moe"] * max(0, n - n_hash)


def rope_dim(t: Fields, compress: Fields, C: int) -> int:
    """The rotated channels of a head: ``partial_rotary_factor`` (the compressed layers' rope parameters',
    else the config's) x ``head_dim``, else ``qk_rope_head_dim`` (else 64 of 512), an even count no more
    than the head."""
    t = compress if compress.has("partial_rotary_factor") else t
    if t.has("partial_rotary_factor"):
        key, R = "partial_rotary_factor", int(C * t.float("partial_rotary_factor", minimum=0.0, maximum=1.0))
    else:
        key, R = "qk_rope_head_dim", t.int("qk_rope_head_dim", default=C * 64 // 512)
    if R % 2 or R > C:
        raise t._err(key, f"gives {R} rotated channels of head_dim {C}: must be an even count no more than the head")
    return R


def _compress_rope(t: Fields) -> Fields:
    """The compressed layers' rope parameters: transformers' ``rope_parameters.compress``, or the release's
    ``compress_rope_theta`` with its top-level scaling (``rope_scaling``; ``rope_parameters`` flat)."""
    rp = t.sub("rope_parameters", default={})
    if isinstance(rp.d.get("compress"), dict):
        return rp.sub("compress")
    sc = t.sub("rope_scaling") if t.has("rope_scaling") else rp
    d = {k: v for k, v in sc.d.items() if k not in ("rope_theta", "main")}
    d["rope_theta"] = t.float("compress_rope_theta", default=160000.0, positive=True)
    return Fields(d, t.where, "compress_rope_theta." if t.has("compress_rope_theta") else sc.prefix)


def runs(hf: dict) -> None:
    """A config whose compressed layers scale their RoPE (the releases' YaRN) is accounted, not run."""
    t = Fields(hf)
    compress = _compress_rope(t)
    kind = compress.str("rope_type", "type", default="default")
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

    t = Fields(hf)
    act = t.str("hidden_act", default="silu")
    if act != "silu":
        raise t._err("hidden_act", f"{act!r} is not supported (only silu is implemented for this family)")
    n, D = t.int("num_hidden_layers", minimum=1), t.int("hidden_size", minimum=1)
    for key in ("attention_bias", "mlp_bias"):
        if t.bool(key, default=False):
            raise t._err(key, "true is not supported (DeepSeek-V4's projections have no biases)")
    compress = _compress_rope(t)
    theta = compress.float("rope_theta", positive=True)  # its scaling: accounted, refused by runs()
    if compress.has("rope_type", "type"):
        scaling_numbers(compress)
    rp = t.sub("rope_parameters", default={})
    C = t.int("head_dim", minimum=1)
    eps = t.float("rms_norm_eps", default=1e-6, positive=True)
    rates = compress_rates(t)
    common = dict(d_model=D, n_heads=t.int("num_attention_heads", minimum=1), head_dim=C,
                  rope_dim=rope_dim(t, compress, C),
                  q_lora=t.int("q_lora_rank", minimum=1), o_groups=t.int("o_groups", minimum=1),
                  o_lora=t.int("o_lora_rank", minimum=1), window=t.int("sliding_window", minimum=1),
                  rope_theta=theta, eps=eps)
    main = rp.sub("main") if isinstance(rp.d.get("main"), dict) else t
    kind = main.str("rope_type", "type", default="default") if main is not t else "default"
    if kind != "default":
        raise main._err("rope_type", f"{kind!r} is not supported (only plain RoPE is implemented)")
    main_theta = main.float("rope_theta", default=10000.0, positive=True)
    if t.int("num_key_value_heads", default=1) != 1:
        raise t._err("num_key_value_heads", f"{t.d['num_key_value_heads']!r} is not supported (V4 attention has "
                                            f"one shared KV head)")
    depth = MHCConfig(d_model=D, n_streams=t.int("hc_mult", minimum=1),
                      sinkhorn_iters=t.int("hc_sinkhorn_iters", minimum=1),
                      eps=t.float("hc_eps", default=1e-6, minimum=0.0), norm_eps=eps)
    moe = dict(d_model=D, n_experts=t.int("n_routed_experts", minimum=1), top_k=t.int("num_experts_per_tok", minimum=1),
               d_expert=t.int("moe_intermediate_size", minimum=1),
               router=t.str("scoring_func", default="sqrtsoftplus"), norm_topk_prob=True,
               routed_scaling=t.float("routed_scaling_factor", default=1.0, positive=True), n_shared=1,
               d_shared=t.int("moe_intermediate_size"),
               swiglu_limit=t.float("swiglu_limit", default=None, positive=True))
    types, mlp = token_types(t, n), channel_types(t, n)
    layers = []
    for i in range(n):
        if types[i] == "compressed_sparse_attention":
            s = rates[types[i]]
            token = CSAConfig(pool=2 * s, stride=s, index_heads=t.int("index_n_heads", minimum=1),
                              index_head_dim=t.int("index_head_dim", minimum=1),
                              index_topk=t.int("index_topk", minimum=1), **common)
        elif types[i] == "heavily_compressed_attention":
            token = HCAConfig(pool=rates[types[i]], **common)
        else:
            token = V4WindowConfig(**{**common, "rope_theta": main_theta})
        if mlp[i] == "hash_moe":
            channel = MoEConfig(routing="hash", vocab_size=t.int("vocab_size", minimum=1), **moe)
        else:
            channel = MoEConfig(router_bias=True, **moe)
        layers.append(LayerConfig(token=token, channel=channel, depth=depth))
    return model_config(hf, t, name="deepseek-v4", title="DeepSeek-V4 (checkpoint)", d_model=D, layers=layers,
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
