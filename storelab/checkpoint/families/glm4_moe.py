"""GLM-4.5 / 4.6 / 4.7 (Zhipu AI, arXiv 2508.06471; ``glm4_moe``): GQA attention with biases on q, k and v
(``attention_bias``; none on o), an optional RMSNorm on each query and key head (``use_qk_norm``),
RoPE on half of each head's channels (``partial_rotary_factor``, 0.5 when the config says nothing),
``first_k_dense_replace`` dense SwiGLU layers, then experts chosen as DeepSeek-V3 does (noaux_tc):
sigmoid scores, the choice on score + ``e_score_correction_bias`` among the ``topk_group`` best of
``n_group`` groups (a group scored by its two best), the chosen scores renormalised
(``norm_topk_prob``) and times ``routed_scaling_factor``, plus ``n_shared_experts`` shared experts of
``moe_intermediate_size`` each (one SwiGLU of their summed width).

Names: transformers' usual ones (the reader's table): ``self_attn.{q,k,v,o}_proj`` (+ q/k/v biases),
``self_attn.{q,k}_norm``, ``mlp.{gate,up,down}_proj`` (dense), ``mlp.gate.weight`` and
``mlp.gate.e_score_correction_bias``, ``mlp.experts.{e}.{gate,up,down}_proj`` (or 3-D),
``mlp.shared_experts.{gate,up,down}_proj``. The multi-token-prediction layers stored after the decoder
(``num_nextn_predict_layers``) are ignored and not counted.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families._reader import Decl, _attention, family


def glm4_moe_token(t, i, kind, decl, D, eps):
    """The reader's attention with per-head q/k norms where ``use_qk_norm`` says so."""
    return _attention(t, i, kind, dataclasses.replace(decl, qk_norm=t.bool("use_qk_norm", default=False)), D, eps)


FAMILY = family(Decl(name="glm4_moe", model_types=("glm4_moe",), title="GLM-4.5 (checkpoint)", o_bias=False,
                     router="sigmoid", router_bias=True, partial=0.5, eps=1e-5, mtp=True, token=glm4_moe_token))
