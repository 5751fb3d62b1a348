"""dots.llm1 (rednote hilab, 2025; ``dots1``): Qwen3's attention (an RMSNorm on each query and key head,
GQA, RoPE) in DeepSeek-V3's mixture of experts: the first ``first_k_dense_replace`` layers dense, the rest
routed by sigmoid scores with a choice bias (``e_score_correction_bias``), chosen within the best
``topk_group`` of ``n_group`` groups, the weights renormalised only with ``norm_topk_prob`` (default false)
and scaled by ``routed_scaling_factor``, beside ``n_shared_experts`` shared experts (one MLP
``n_shared_experts * moe_intermediate_size`` wide). Windows as Qwen2 places them (``sliding_window`` from
layer ``max_window_layers`` on; dots.llm1 sets it to the layer count: none).

Everything is read by the shared reader (``_reader.py``); the names are transformers' (``mlp.gate``,
``mlp.gate.e_score_correction_bias``, ``mlp.experts.gate_up_proj`` / ``down_proj``, ``mlp.shared_experts``).
"""

from storelab.checkpoint.families._reader import Decl, family

FAMILY = family(Decl(name="dots1", model_types=("dots1",), title="dots.llm1 (checkpoint)", qk_norm=True,
                     router="sigmoid", router_bias=True, norm_topk_default=False))
