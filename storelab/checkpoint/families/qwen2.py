"""Qwen2 / Qwen2.5 (arXiv 2407.10671) and Qwen2-MoE: biases on the query, key and value projections
(always, whatever ``attention_bias`` says) and none on the output; a window on the layers from
``max_window_layers`` on when ``use_sliding_window``. Qwen2-MoE adds experts chosen by a softmax
router (``norm_topk_prob`` default false) and one shared expert behind a sigmoid gate.
"""

from storelab.checkpoint.families._reader import Decl, family

FAMILY = family(Decl(name="qwen2", model_types=("qwen2", "qwen2_moe"), title="Qwen2 (checkpoint)", qkv_bias=True,
                     o_bias=False, norm_topk_default=False, shared_gate=True))
