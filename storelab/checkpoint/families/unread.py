"""Decoders storelab does not read yet, each refused by its ``model_type`` with the reason.

transformers 5.23 lists these among its causal LMs; storelab has no store for a device they use, or their
files have not yet been compared with storelab's stores. Reading a config of one of them is refused with
exit code 2, naming the model type and the reason (``storelab models --checkpoint``, ``memory``, ``load``):
never a traceback, never a silent misreading. ``tests/test_family_coverage.py`` holds every causal-LM model
type of transformers to a family that reads it, this list, or the test's short list of encoders and
encoder-decoders (which are not decoders). A family added moves its model types out of ``REASONS``.
"""

from __future__ import annotations

from storelab.checkpoint.families._family import Family
from storelab.checkpoint.shards import CheckpointError

__all__ = ["FAMILY", "REASONS"]

_ABSOLUTE = "learned or sinusoidal absolute position embeddings (storelab's attention rotates or uses no positions)"
_ALIBI = "ALiBi position biases (storelab's attention has none)"
_BIASED_NORM = ("biased LayerNorms, fused or parallel blocks of the GPT-J / Phi-1 era: not yet compared with storelab's "
                "layer_bias norm and parallel blocks (gpt_neox.py reads the like)")
_INDEXED = "layer type 'indexed_attention' (an indexer of its own, not compared with storelab's dsa store)"
_GEMMA4 = "Gemma 4's layers (keys as values, an MoE block beside the MLP, per-layer scalars): no store yet"
_MULTIMODAL = "a multimodal causal LM whose image tokens enter the decoder (no text-only decoder to read)"

REASONS: dict[str, str] = {
    **dict.fromkeys(("gpt2", "gpt-sw3", "openai-gpt", "gpt_neo", "gpt_bigcode", "opt", "xglm", "biogpt", "ctrl",
                     "git"), _ABSOLUTE),
    **dict.fromkeys(("bloom", "mpt"), _ALIBI),
    **dict.fromkeys(("falcon", "gpt_neox_japanese", "phi", "persimmon", "codegen", "gptj",
                     "jais2", "nemotron"), _BIASED_NORM),
    **dict.fromkeys(("axk2", "dots3_note", "dots3_note_text", "qwen4_exp", "qwen4_exp_text", "hy_v4"), _INDEXED),
    **dict.fromkeys(("gemma4_assistant", "gemma4_unified", "gemma4_unified_assistant", "gemma4_unified_text"),
                    _GEMMA4),
    **dict.fromkeys(("emu3", "fuyu", "got_ocr2", "phi4_multimodal"), _MULTIMODAL),
    "olmo": "weightless LayerNorms (OLMo 1's non-parametric norm; no store norm without a weight)",
    "apertus": "the xIELU activation (trainable per-layer alpha_p / alpha_n): no ffn activation for it",
    "bitnet": "ternary weights with sub-norms inside the attention and the MLP (attn_sub_norm, ffn_sub_norm)",
    "diffllama": "differential attention (two softmax maps subtracted, arXiv 2410.05258): no store",
    "doge": "dynamic mask attention and cross-domain experts (keys / values per expert product): no store",
    "dbrx": "clip_qkv clamps the fused query/key/value projections: no store does",
    "jetmoe": "mixture of attention heads (attention experts, arXiv 2404.07413): no store",
    "minicpm3": "MLA with muP's per-layer residual scale (scale_depth / sqrt(layers)) not folded yet",
    "longcat_flash": "two attentions and two MLPs per layer with zero-computation experts (shortcut MoE): no store",
    "rwkv": "RWKV-4 time mixing (arXiv 2305.13048): no store",
    # remote-code RWKV releases (fla / RWKV's own modeling files), refused by name rather than as unknown types
    "rwkv5": "RWKV-5 (Eagle) matrix-valued states with per-head decay and token shift (arXiv 2404.05892): no store",
    "rwkv6": "RWKV-6 (Finch) data-dependent decay and token shift (arXiv 2404.05892): no store",
    "rwkv7": "RWKV-7 (Goose) generalized delta rule with in-context learning rates and a value residual across "
             "layers (arXiv 2503.14456): no store yet",
    "xlstm": "mLSTM / sLSTM blocks (arXiv 2405.04517): no store",
    "zamba": "shared attention blocks reading the embeddings beside Mamba layers: no store",
    "zamba2": "shared attention blocks with LoRA per use beside Mamba-2 layers: no store",
    "gemma3n": "AltUp, Laurel blocks, per-layer inputs and KV-cache sharing across layers: no store",
    "gemma3n_text": "AltUp, Laurel blocks, per-layer inputs and KV-cache sharing across layers: no store",
    "inkling_text": "layer type 'hybrid' (two mixers in one layer): no store",
    "inkling2_text": "layer type 'hybrid' (two mixers in one layer): no store",
    "zaya": "compressed convolutional attention (CCA) layers: no store",
    "moshi": "audio codebooks read by a depth transformer per time step: not a text decoder",
    "cpmant": "T5-style relative position buckets: no store",
    "blt": "byte patches through a local encoder and decoder (Byte Latent Transformer): no store",
    "hrm_text": "hierarchical recurrent modules iterated per token (HRM): no store",
    "mllama": "cross-attention layers reading image states between the self-attention layers: no store",
    # 2026 decoders of transformers 5.23 and wrappers whose decoder is their own (issue 36)
    **dict.fromkeys(("muse_glimmer", "muse_glimmer_text"),
                    "sandwich norms whose post-mixer norms have an eps of their own (post_norm_eps, 1e-8, beside "
                    "rms_norm_eps 1e-5 before the mixers): storelab's block norms share one norm_eps. Otherwise "
                    "expressible: its weightless q/k head norms (before RoPE, which keeps a head's RMS) as "
                    "qk_l2_norm with qk_scale_factor in attn_scale, the embedding norm folded into the untied "
                    "embedding rows, NoPE where layer_rope_theta is 0, output_multiplier and the softcap"),
    **dict.fromkeys(("glm5_next", "glm5_next_text"),
                    "MLA layers whose DSA indexer selects pooled groups of index_kpool tokens (KPool): no store; "
                    "its linear-attention layers (a lower-bounded forget gate) and mHC streams (arXiv 2512.24880) "
                    "are not yet compared with storelab's kda and mHC"),
    **dict.fromkeys(("mistral_large4", "mistral_large4_text"),
                    "a learned per-head query scale by log position (softmax_scaling), learned RoPE frequency scales "
                    "(LeRoPE alpha) and latent caches shared across layers (kv_source_layers) with a DSA indexer of "
                    "its own: no store"),
    **dict.fromkeys(("kosmos-2", "kosmos-2.5"), _ABSOLUTE),
    "chameleon": _MULTIMODAL,
    "idefics": "gated cross-attention layers reading image states (a Flamingo-style perceiver): no store",
    "evolla": "cross-attention layers reading a protein encoder's states: no store",
    **dict.fromkeys(("qwen2_5_omni", "qwen3_omni_moe"),
                    "an omni model: a thinker whose text model (multimodal RoPE over a decoder of its own) is not "
                    "yet compared with storelab's stores, and a talker decoding speech"),
    "axk1": ("an RMSNorm on the MoE block's output (post_mlp_layernorm, after the routed and shared experts are "
             "summed) on the sparse layers only: storelab's block norms sit around both sublayers of a layer "
             "('pre', 'post', 'sandwich'), never after the channel alone"),
    "beam": ("depth-scaled residual adds (the k-th add keeps sqrt((k-1)/k) of the stream and adds 1/sqrt(k) of "
             "the sublayer's output: exact only with a norm eps per layer, which storelab's norms do not have) and, "
             "on the layers without RoPE, queries times (1 + (p + 1) / 2048)^0.1 (no attention temperature of that "
             "form)"),
    "kolibri1": ("a router that chooses its experts by the raw logits plus the choice bias (top-k of logits + "
                 "expert_bias) and weights them by sigmoid(logit): storelab's choice bias is added to the sigmoid "
                 "scores"),
    "modernbert-decoder": ("a LayerNorm of the token embeddings (the first layer's attention reads them without "
                           "its own norm) and a prediction head (dense, activation, LayerNorm) before the LM head: "
                           "no store"),
    "nanochat": ("weightless RMS norms (no weight) before each mixer, on each query and key head after the "
                 "rotation and at the end, and one more on the token embeddings before the first layer: no store "
                 "norm without a weight, no embedding norm"),
    "phimoe": ("the sparsemixer router (PhimoeTopKRouter: the top two experts picked one after the other, each "
               "weighted by a softmax over the router logits within 2 x router_jitter_noise of that pick, arXiv "
               "2409.12136): no moe router does; and lm_head_bias"),
}


def to_config(hf: dict):
    mt = hf.get("model_type")
    raise CheckpointError(f"config.json: model_type: {mt!r} is not read by storelab yet: {REASONS[mt]}")


def _refused() -> str:
    by_reason: dict[str, list[str]] = {}
    for mt, why in REASONS.items():
        by_reason.setdefault(why, []).append(mt)
    return "not read: " + "; ".join(f"{why} ({', '.join(types)})" for why, types in by_reason.items())


FAMILY = Family(name="unread", model_types=tuple(REASONS), to_config=to_config,
                table=lambda hf, cfg, names: {}, stores=(), refused=_refused(),
                oracle="none: every config of these model types is refused by name, with the reason")
