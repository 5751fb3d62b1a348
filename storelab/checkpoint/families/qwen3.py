"""Qwen3 and Qwen3-MoE (arXiv 2505.09388): Qwen2's decoder with an RMSNorm on each query and key head
(arXiv 2302.05442's QK-norm) and no projection biases; the MoE layers choose 8 of 128 experts with a
softmax router (``norm_topk_prob``), no shared expert.
"""

from storelab.checkpoint.families._reader import Decl, family

FAMILY = family(Decl(name="qwen3", model_types=("qwen3", "qwen3_moe"), title="Qwen3 (checkpoint)", qk_norm=True,
                     norm_topk_default=False))
