"""DeepSeek-MoE (DeepSeekMoE 16B base / chat, arXiv 2401.06066; remote code ``DeepseekForCausalLM``, ``model_type``
"deepseek"): Llama's attention (MHA or GQA with RoPE, no biases) under fine-grained experts with shared experts.

* channel: the first ``first_k_dense_replace`` layers (then every layer not a multiple of ``moe_layer_freq``) a
  SwiGLU MLP of ``intermediate_size``; the others ``n_routed_experts`` experts of ``moe_intermediate_size``, the top
  ``num_experts_per_tok`` of a softmax over all experts (``scoring_func`` "softmax"), their weights renormalised
  only with ``norm_topk_prob`` (false in the 16B release), plus ``n_shared_experts`` experts always on, stored as
  one MLP of n_shared x moe_intermediate_size (``mlp.shared_experts``) and added unweighted;
* pre-norm RMSNorms (eps ``rms_norm_eps``), untied embeddings.

Everything is a field the shared reader knows (``_reader.py``); the names are transformers' DeepSeek-V2 names
without MLA: ``self_attn.{q,k,v,o}_proj``, ``mlp.gate.weight``, ``mlp.experts.j.{gate,up,down}_proj``,
``mlp.shared_experts.{gate,up,down}_proj``.

Parameters per MoE layer: E*3*D*I + E*D router + 3*D*(S*I) shared, beside the attention's D*(H + 2G)*K + H*K*D;
the state is the keys and values.
"""

from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, family

_FAMILY = family(Decl(stores=("attention", "ffn", "moe", "residual"), name="deepseek", model_types=("deepseek",),
                      title="DeepSeek-MoE (checkpoint)", router="softmax", norm_topk_default=False))

FAMILY = Family(**{**_FAMILY.__dict__,
                   "oracle": "transformers 5.23's qwen2_moe (its shared-expert gate fixed at 1/2, folded out) renamed "
                             "into DeepSeek's names: logits (fp32, bf16), prefill-then-step, parameters; "
                             "DeepSeekMoE 16B counted against its 16.4B"})
