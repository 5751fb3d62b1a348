"""Qwen3-VL and Qwen3-VL-MoE, the text model (Qwen, arXiv 2511.21631; ``qwen3_vl``, ``qwen3_vl_moe`` and their
``_text`` configs): Qwen3's decoder (an RMSNorm on each query and key head, GQA, a SwiGLU MLP or softmax top-k
experts, always renormalised) under the image-text wrapper.

* positions: interleaved multimodal RoPE (``mrope_section`` of the temporal, height and width indices); a text
  token has the same index on all three, so its rotation is plain RoPE over the whole head, base
  ``rope_theta`` (500,000 when unnamed); the vision tower's deepstack features join only where images are;
* experts: the checkpoint stores ``mlp.experts.gate_up_proj`` as [E, D, 2I] and ``down_proj`` as [E, I, D]
  (transformers transposes both when it loads them, ``conversion_mapping.py``); the table transposes them to
  our [E, 2I, D] and [E, D, I] (a file saved by transformers 5 is already ours and read as it is).

Parameters per layer: Qwen3's; the vision tower (``model.visual``) is left out (``towers.py`` counts it). Names:
``model.language_model.layers.i.*`` as Qwen3's, ``lm_head.weight``.
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl
from storelab.checkpoint.table import Src

__all__ = ["FAMILY"]


def _transposed(tab: dict, hf: dict, cfg, names: set[str]) -> None:
    """The fused experts as the published checkpoints store them ([E, D, 2I], [E, I, D]) turned to ours; a file
    already in our layout (transformers' ``save_pretrained``) is read as it is, as transformers'
    ``Transpose(check_dims=True)`` does."""
    D = cfg.d_model
    for i, lay in enumerate(cfg.layers):
        if lay.channel.KIND != "moe":
            continue
        for ours, d_at in ((f"blocks.{i}.channel.gate_up", 2), (f"blocks.{i}.channel.down", 1)):
            src = tab[ours]
            if src.fn is not None:  # stacked from per-expert matrices: already ours
                continue
            tab[ours] = Src(src.names, lambda w, d_at=d_at: w if w.shape[d_at] == D else w.transpose(1, 2).contiguous(),
                            "[E, in, out] transposed where not ours")


DECL = Decl(name="qwen3_vl", model_types=("qwen3_vl", "qwen3_vl_moe", "qwen3_vl_text", "qwen3_vl_moe_text"),
            title="Qwen3-VL text (checkpoint)", qk_norm=True, theta=500000.0, extra=_transposed)

FAMILY = _reader.family(DECL)
