"""DeepSeek-V2 / V2-Lite / V2.5 (arXiv 2405.04434): the MLA layers of DeepSeek-V3 (``deepseek_v3.py``) with
V2's experts: softmax scores, chosen by plain top-k (``topk_method`` "greedy") or among the ``topk_group``
groups with the best single score ("group_limited_greedy", device-limited routing), the chosen weights not
renormalised, times ``routed_scaling_factor``; shared experts; ``first_k_dense_replace`` dense layers.
"""

from storelab.checkpoint.families._reader import Decl, family
from storelab.checkpoint.families.deepseek_v3 import mla, mla_table

FAMILY = family(Decl(stores=("mla", "ffn", "moe", "residual"),
                     name="deepseek_v2", model_types=("deepseek_v2",), title="DeepSeek-V2 (checkpoint)",
                     router="softmax", norm_topk_default=False, token=mla, token_table=mla_table, mtp=True))
