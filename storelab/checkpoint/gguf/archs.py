"""The plain decoders' GGUF architectures: llama, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, lfm2,
gpt-oss, mamba. Sources: llama.cpp's converter (``convert_hf_to_gguf.py``; ``conversion/*.py`` in 2026
trees: ``LlamaModel.permute``, ``Gemma2Model``/``Gemma3Model`` adding ``norm_shift`` 1 to every norm,
``GptOssModel`` de-interleaving ``gate_up_proj``, ``MambaModel`` storing ``-exp(A_log)`` and the
squeezed conv), its loader (``src/llama-model.cpp``: Gemma's attention scale by model size, Gemma 3's
fixed 6-layer window pattern and local theta 10,000), and transformers 5.23's reader of the same files
(``modeling_gguf_pytorch_utils.py``, ``integrations/ggml.py``).

| general.architecture | model_type   | undone                                                        |
|----------------------|--------------|---------------------------------------------------------------|
| llama                | llama        | q/k rows permuted per head (``unpermute``); Llama 3's ``rope_freqs`` factors -> ``rope_scaling`` llama3 |
| qwen2, qwen3         | qwen2, qwen3 | nothing (Qwen's converter does not permute)                   |
| qwen2moe, qwen3moe   | qwen2_moe, qwen3_moe | experts 3-D ``ffn_{gate,up,down}_exps`` (or fused ``ffn_gate_up_exps``) -> ``gate_up_proj`` / ``down_proj``; the shared gate ``[D]`` -> ``[1, D]`` |
| gemma2, gemma3       | gemma2, gemma3_text | every norm stored 1 + w                                 |
| lfm2                 | lfm2         | the conv ``[D, W]`` -> ``[D, 1, W]``; attention layers from the per-layer ``head_count_kv`` |
| gpt-oss              | gpt_oss      | gate/up re-interleaved into ``gate_up_proj [E, D, 2I]``, experts transposed back |
| mamba                | mamba        | ``ssm_a`` = -exp(A_log) -> A_log; conv ``[C, W]`` -> ``[C, 1, W]`` |
"""

from __future__ import annotations

import torch
from gguf.constants import MODEL_TENSOR as T

from storelab.checkpoint.gguf.arch import LAYER, Arch, Meta, Rule, cat_rows, common_config, g, minus_one, rule, \
    unpermute
from storelab.checkpoint.gguf.rope_freqs import llama3_scaling
from storelab.checkpoint.shards import CheckpointError

__all__ = ["ARCHS"]

ATTN = f"{LAYER}.self_attn"
MLP = f"{LAYER}.mlp"


def base_rules(*, norm_fn=None) -> list[Rule]:
    """Embedding, final norm, LM head (absent when tied)."""
    what = "1 + w -> w" if norm_fn else ""
    return [rule("model.embed_tokens.weight", g(T.TOKEN_EMBD)),
            rule("model.norm.weight", g(T.OUTPUT_NORM), fn=norm_fn, what=what),
            rule("lm_head.weight", g(T.OUTPUT))]


def attention_rules(hf: dict, *, permute: bool = False, norm_fn=None, out: str = "o_proj",
                    norms: tuple[str, str] = ("q_norm", "k_norm")) -> list[Rule]:
    """q, k, v, o (weights and any biases) and per-head q/k norms, under ``self_attn``."""
    H, K = hf["num_attention_heads"], hf["num_key_value_heads"]
    q, k = (unpermute(H), unpermute(K)) if permute else (None, None)
    perm = "rows un-permuted per head (LlamaModel.permute undone)" if permute else ""
    rules = []
    for sfx in (".weight", ".bias"):
        rules += [rule(f"{ATTN}.q_proj{sfx}", g(T.ATTN_Q, sfx), fn=q, what=perm),
                  rule(f"{ATTN}.k_proj{sfx}", g(T.ATTN_K, sfx), fn=k, what=perm),
                  rule(f"{ATTN}.v_proj{sfx}", g(T.ATTN_V, sfx)),
                  rule(f"{ATTN}.{out}{sfx}", g(T.ATTN_OUT, sfx))]
    what = "1 + w -> w" if norm_fn else ""
    rules += [rule(f"{ATTN}.{norms[0]}.weight", g(T.ATTN_Q_NORM), fn=norm_fn, what=what),
              rule(f"{ATTN}.{norms[1]}.weight", g(T.ATTN_K_NORM), fn=norm_fn, what=what)]
    return rules


def mlp_rules(prefix: str = MLP) -> list[Rule]:
    return [rule(f"{prefix}.gate_proj.weight", g(T.FFN_GATE)), rule(f"{prefix}.up_proj.weight", g(T.FFN_UP)),
            rule(f"{prefix}.down_proj.weight", g(T.FFN_DOWN))]


def pre_norm_rules() -> list[Rule]:
    return [rule(f"{LAYER}.input_layernorm.weight", g(T.ATTN_NORM)),
            rule(f"{LAYER}.post_attention_layernorm.weight", g(T.FFN_NORM))]


def experts_rules(prefix: str = MLP) -> list[Rule]:
    """Router and 3-D experts: llama.cpp's ``ffn_gate_exps`` / ``ffn_up_exps`` ``[E, I, D]`` (or fused
    ``ffn_gate_up_exps`` ``[E, 2I, D]``, gate first) -> transformers' ``gate_up_proj`` ``[E, 2I, D]``;
    ``ffn_down_exps`` ``[E, D, I]`` is transformers' ``down_proj`` as it is."""
    x = f"{prefix}.experts"
    return [rule(f"{prefix}.gate.weight", g(T.FFN_GATE_INP)),
            rule(f"{x}.gate_up_proj", g(T.FFN_GATE_UP_EXP)),
            rule(f"{x}.gate_up_proj", g(T.FFN_GATE_EXP), g(T.FFN_UP_EXP), fn=cat_rows,
                 what="gate and up experts stacked, gate rows first"),
            rule(f"{x}.down_proj", g(T.FFN_DOWN_EXP))]


# ---- llama, qwen2, qwen3 --------------------------------------------------------------------------------

ROPE_FREQS = g(T.ROPE_FREQS)


def llama_config(m: Meta) -> dict:
    """Llama 3's RoPE scaling is the ``rope_freqs.weight`` factors (no metadata): read back as transformers'
    llama3 ``rope_scaling`` (``rope_freqs.py``), or refused by name where no llama3 scaling gives them."""
    hf = common_config(m)
    hf["attention_bias"] = "blk.0.attn_q.bias" in m.shapes
    hf["head_dim"] = m.int("rope.dimension_count", hf["head_dim"], minimum=1)
    if ROPE_FREQS in m.shapes:
        where = f"{m.path}: tensor {ROPE_FREQS!r}"
        if "rope_scaling" in hf:
            raise CheckpointError(f"{where}: per-frequency factors beside metadata {m.full('rope.scaling.type')!r} "
                                  f"{hf['rope_scaling']['rope_type']!r}: two scalings, not read")
        scaling = llama3_scaling(m.values(ROPE_FREQS).flatten().tolist(), theta=hf["rope_theta"],
                                 dim=hf["head_dim"], where=where)
        if scaling is not None:
            hf["rope_scaling"] = scaling
    return hf


def llama_rules(hf: dict) -> list[Rule]:
    return base_rules() + pre_norm_rules() + attention_rules(hf, permute=True) + mlp_rules()


def plain_rules(hf: dict) -> list[Rule]:
    return base_rules() + pre_norm_rules() + attention_rules(hf) + mlp_rules()


# ---- qwen2moe, qwen3moe -----------------------------------------------------------------------------------

def moe_config(m: Meta, **defaults) -> dict:
    hf = common_config(m)
    hf.update(num_experts=m.int("expert_count", minimum=1), num_experts_per_tok=m.int("expert_used_count", minimum=1),
              moe_intermediate_size=m.int("expert_feed_forward_length", minimum=1), **defaults)
    if m.has("expert_shared_feed_forward_length"):
        hf["shared_expert_intermediate_size"] = m.int("expert_shared_feed_forward_length", minimum=1)
    hf.setdefault("intermediate_size", hf["moe_intermediate_size"])
    return hf


def moe_rules(hf: dict) -> list[Rule]:
    sh = f"{MLP}.shared_expert"
    return (base_rules() + pre_norm_rules() + attention_rules(hf) + experts_rules()
            + [rule(f"{sh}.gate_proj.weight", g(T.FFN_GATE_SHEXP)), rule(f"{sh}.up_proj.weight", g(T.FFN_UP_SHEXP)),
               rule(f"{sh}.down_proj.weight", g(T.FFN_DOWN_SHEXP)),
               rule(f"{MLP}.shared_expert_gate.weight", g(T.FFN_GATE_INP_SHEXP), fn=lambda w: w.reshape(1, -1),
                    what="[D] -> [1, D]")])


# ---- gemma2, gemma3 ---------------------------------------------------------------------------------------

def gemma_scalar(m: Meta, hf: dict, big_layers: int) -> float:
    """``query_pre_attn_scalar``: llama.cpp scales queries by 1/sqrt(width / heads) for the 27B models (told by
    their depth, 46 layers for Gemma 2, 62 for Gemma 3) and by 1/sqrt(head_dim) otherwise (llama-model.cpp,
    after gemma_pytorch's config); a file's ``attention.scale`` (1/sqrt(s)) wins."""
    if m.has("attention.scale"):
        return 1.0 / m.float("attention.scale") ** 2
    if hf["num_hidden_layers"] == big_layers:
        return hf["hidden_size"] / hf["num_attention_heads"]
    return hf["head_dim"]


def gemma2_config(m: Meta) -> dict:
    hf = common_config(m)
    hf.update(query_pre_attn_scalar=gemma_scalar(m, hf, 46), sliding_window=m.int("attention.sliding_window", minimum=1),
              attn_logit_softcapping=m.raw("attn_logit_softcapping", None),
              final_logit_softcapping=m.raw("final_logit_softcapping", None), hidden_activation="gelu_pytorch_tanh",
              layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                           for i in range(hf["num_hidden_layers"])])
    return hf


def gemma3_config(m: Meta) -> dict:
    """Gemma 3: llama.cpp fixes five window layers to one full one and the window layers' theta at 10,000
    (``set_swa_pattern(6)``, ``rope_freq_base_train_swa``); linear rope scaling on the full layers."""
    hf = common_config(m)
    n = hf["num_hidden_layers"]
    hf.update(query_pre_attn_scalar=gemma_scalar(m, hf, 62), sliding_window=m.int("attention.sliding_window", minimum=1),
              final_logit_softcapping=m.raw("final_logit_softcapping", None), attn_logit_softcapping=None,
              rope_local_base_freq=10000.0, hidden_activation="gelu_pytorch_tanh",
              layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)])
    return hf


def gemma_rules(hf: dict) -> list[Rule]:
    w = "1 + w -> w"
    return (base_rules(norm_fn=minus_one) + attention_rules(hf, norm_fn=minus_one) + mlp_rules()
            + [rule(f"{LAYER}.input_layernorm.weight", g(T.ATTN_NORM), fn=minus_one, what=w),
               rule(f"{LAYER}.post_attention_layernorm.weight", g(T.ATTN_POST_NORM), fn=minus_one, what=w),
               rule(f"{LAYER}.pre_feedforward_layernorm.weight", g(T.FFN_NORM), fn=minus_one, what=w),
               rule(f"{LAYER}.post_feedforward_layernorm.weight", g(T.FFN_POST_NORM), fn=minus_one, what=w)])


# ---- lfm2 -------------------------------------------------------------------------------------------------

def lfm2_config(m: Meta) -> dict:
    """LFM2: llama.cpp marks the attention layers by a non-zero per-layer ``attention.head_count_kv`` (0 for a
    convolution layer) and writes the feed-forward's final width (transformers' ``block_auto_adjust_ff_dim``
    false)."""
    hf = common_config(m)
    kv = m.ints("attention.head_count_kv", hf["num_hidden_layers"])
    hf.update(num_key_value_heads=max(kv), conv_L_cache=m.int("shortconv.l_cache", minimum=2),
              block_auto_adjust_ff_dim=False, block_ff_dim=hf["intermediate_size"],
              conv_bias="blk.0.shortconv.in_proj.bias" in m.shapes,
              layer_types=["full_attention" if k else "conv" for k in kv], tie_word_embeddings=True)
    hf["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
    return hf


def lfm2_rules(hf: dict) -> list[Rule]:
    c, f = f"{LAYER}.conv", f"{LAYER}.feed_forward"
    return [rule("model.embed_tokens.weight", g(T.TOKEN_EMBD)),
            rule("model.embedding_norm.weight", g(T.TOKEN_EMBD_NORM)),
            rule(f"{LAYER}.operator_norm.weight", g(T.ATTN_NORM)),
            rule(f"{LAYER}.ffn_norm.weight", g(T.FFN_NORM)),
            rule(f"{c}.in_proj.weight", g(T.SHORTCONV_INPROJ)), rule(f"{c}.in_proj.bias", g(T.SHORTCONV_INPROJ, ".bias")),
            rule(f"{c}.out_proj.weight", g(T.SHORTCONV_OUTPROJ)),
            rule(f"{c}.out_proj.bias", g(T.SHORTCONV_OUTPROJ, ".bias")),
            rule(f"{c}.conv.weight", g(T.SHORTCONV_CONV), fn=lambda w: w.unsqueeze(1), what="[D, W] -> [D, 1, W]"),
            rule(f"{c}.conv.bias", g(T.SHORTCONV_CONV, ".bias")),
            rule(f"{f}.w1.weight", g(T.FFN_GATE)), rule(f"{f}.w3.weight", g(T.FFN_UP)),
            rule(f"{f}.w2.weight", g(T.FFN_DOWN))] + attention_rules(hf, out="out_proj",
                                                                    norms=("q_layernorm", "k_layernorm"))


# ---- gpt-oss ----------------------------------------------------------------------------------------------

def gpt_oss_config(m: Meta) -> dict:
    hf = common_config(m)
    hf.update(num_local_experts=m.int("expert_count", minimum=1),
              num_experts_per_tok=m.int("expert_used_count", minimum=1),
              intermediate_size=m.int("expert_feed_forward_length", minimum=1),
              sliding_window=m.int("attention.sliding_window", minimum=1), attention_bias=True,
              layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                           for i in range(hf["num_hidden_layers"])])
    if "rope_scaling" in hf:  # llama.cpp's yarn keeps transformers' defaults beta_fast 32, beta_slow 1
        hf["rope_scaling"] = {"beta_fast": 32.0, "beta_slow": 1.0, **hf["rope_scaling"]}
    return hf


def _interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """[E, I, ...] gate and up -> [E, 2I, ...] with gate rows at even, up rows at odd positions (transformers'
    gpt-oss layout, which llama.cpp's ``GptOssModel`` splits by ``[::2]`` / ``[1::2]``)."""
    return torch.stack([gate, up], dim=2).reshape(gate.shape[0], 2 * gate.shape[1], *gate.shape[2:])


def gpt_oss_rules(hf: dict) -> list[Rule]:
    x = f"{MLP}.experts"
    return (base_rules() + attention_rules(hf)
            + [rule(f"{LAYER}.input_layernorm.weight", g(T.ATTN_NORM)),
               rule(f"{LAYER}.post_attention_layernorm.weight", g(T.ATTN_POST_NORM)),
               rule(f"{ATTN}.sinks", g(T.ATTN_SINKS)),
               rule(f"{MLP}.router.weight", g(T.FFN_GATE_INP)), rule(f"{MLP}.router.bias", g(T.FFN_GATE_INP, ".bias")),
               rule(f"{x}.gate_up_proj", g(T.FFN_GATE_EXP), g(T.FFN_UP_EXP),
                    fn=lambda a, b: _interleave(a, b).transpose(1, 2),
                    what="gate/up [E, I, D] interleaved and transposed to [E, D, 2I]"),
               rule(f"{x}.gate_up_proj_bias", g(T.FFN_GATE_EXP, ".bias"), g(T.FFN_UP_EXP, ".bias"), fn=_interleave,
                    what="gate/up biases interleaved"),
               rule(f"{x}.down_proj", g(T.FFN_DOWN_EXP), fn=lambda w: w.transpose(1, 2),
                    what="[E, D, I] -> [E, I, D]"),
               rule(f"{x}.down_proj_bias", g(T.FFN_DOWN_EXP, ".bias"))])


# ---- mamba ------------------------------------------------------------------------------------------------

def mamba_config(m: Meta) -> dict:
    D = m.int("embedding_length", minimum=1)
    return {"hidden_size": D, "num_hidden_layers": m.int("block_count", minimum=1),
            "intermediate_size": m.int("ssm.inner_size", minimum=1), "state_size": m.int("ssm.state_size", minimum=1),
            "conv_kernel": m.int("ssm.conv_kernel", minimum=1), "time_step_rank": m.int("ssm.time_step_rank", minimum=1),
            "layer_norm_epsilon": m.float("attention.layer_norm_rms_epsilon", 1e-5),
            "vocab_size": m.tensor_shape("token_embd.weight")[0], "use_conv_bias": "blk.0.ssm_conv1d.bias" in m.shapes,
            "use_bias": "blk.0.ssm_in.bias" in m.shapes, "tie_word_embeddings": "output.weight" not in m.shapes,
            "max_position_embeddings": m.int("context_length", 0)}


def mamba_rules(hf: dict) -> list[Rule]:
    b, x = "backbone.layers.{bid}", "backbone.layers.{bid}.mixer"
    rules = [rule("backbone.embeddings.weight", g(T.TOKEN_EMBD)), rule("backbone.norm_f.weight", g(T.OUTPUT_NORM)),
             rule("lm_head.weight", g(T.OUTPUT)), rule(f"{b}.norm.weight", g(T.ATTN_NORM)),
             rule(f"{x}.conv1d.weight", g(T.SSM_CONV1D), fn=lambda w: w.unsqueeze(1), what="[C, W] -> [C, 1, W]"),
             rule(f"{x}.A_log", g(T.SSM_A, ""), fn=lambda a: torch.log(-a), what="-exp(A_log) -> A_log"),
             rule(f"{x}.D", g(T.SSM_D, "")), rule(f"{x}.x_proj.weight", g(T.SSM_X))]
    for sfx in (".weight", ".bias"):
        rules += [rule(f"{x}.in_proj{sfx}", g(T.SSM_IN, sfx)), rule(f"{x}.out_proj{sfx}", g(T.SSM_OUT, sfx)),
                  rule(f"{x}.dt_proj{sfx}", g(T.SSM_DT, sfx))]
    return rules + [rule(f"{x}.conv1d.bias", g(T.SSM_CONV1D, ".bias"))]


ARCHS = (
    Arch("llama", "llama", llama_config, llama_rules, config_tensors=(ROPE_FREQS,)),
    Arch("qwen2", "qwen2", common_config, plain_rules),
    Arch("qwen3", "qwen3", common_config, plain_rules),
    Arch("qwen2moe", "qwen2_moe", lambda m: moe_config(m, norm_topk_prob=False), moe_rules),
    Arch("qwen3moe", "qwen3_moe", lambda m: moe_config(m, norm_topk_prob=True), moe_rules),
    Arch("gemma2", "gemma2", gemma2_config, gemma_rules),
    Arch("gemma3", "gemma3_text", gemma3_config, gemma_rules),
    Arch("lfm2", "lfm2", lfm2_config, lfm2_rules),
    Arch("gpt-oss", "gpt_oss", gpt_oss_config, gpt_oss_rules),
    Arch("mamba", "mamba", mamba_config, mamba_rules),
)

