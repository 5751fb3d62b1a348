"""What a published checkpoint holds beside the text model storelab builds, counted from config.json.

    parts(hf, cfg) -> list[Part]     # the vision / audio towers and the MTP layers, each named
    total(cfg, found) -> (text stored + every counted part, names of the parts not counted)
    note(found) -> str               # one line for a ModelConfig's notes

A multimodal release publishes one figure for the whole: Qwen3.5-0.8B's 873M is its text model
(752,393,024 parameters, ``storelab models --checkpoint``), its vision tower (100,592,896) and its
multi-token-prediction layer (20,452,864). The text model is what ``load`` builds; the rest is
counted here, per kind, by a small function of the fields its config publishes:

* ``qwen_vision`` (Qwen3-VL, Qwen3.5, Qwen3.5-MoE; ``vision_config``): with H ``hidden_size``, I
  ``intermediate_size``, L ``depth``, a patch embedding Conv3d ``[H, in_channels, temporal_patch_size,
  patch_size, patch_size]`` with a bias, a learned position table ``[num_position_embeddings, H]``; per
  block two LayerNorms (weight and bias), fused qkv ``[3H, H]`` and the output ``[H, H]``, a two-matrix
  MLP ``[I, H]``, ``[H, I]``, every matrix with a bias: 4H^2 + 2HI + 9H + I. The merger of
  ``spatial_merge_size``^2 patches (W = H m^2): a LayerNorm of H, ``[W, W]`` and ``[out_hidden_size, W]``
  with biases; Qwen3-VL adds one merger per ``deepstack_visual_indexes`` entry, its LayerNorm over W.
  Rotary positions: no parameters.
* ``siglip_vision`` (Gemma 3's SigLIP, ``vision_config``): a patch Conv2d ``[H, num_channels, p, p]``
  with a bias, a position table of (image_size / p)^2 rows; per layer two LayerNorms, q, k, v, out
  ``[H, H]`` and the MLP, all with biases: 4H^2 + 2HI + 9H + I; a final LayerNorm; with
  ``vision_use_head`` the attention-pooling head (a probe vector, torch's MultiheadAttention with its
  in-projection ``[3H, H]`` and out-projection, a LayerNorm, the MLP). Gemma 3's projector adds
  ``[H, text hidden]`` and an RMSNorm of H.
* Kimi K3's MoonViT, MiniMax-M3's tower and Llama 4's are counted by their families' ``vision_params``
  (``kimi_linear``, ``minimax_m3_vl``, ``llama4``), reached through the same table.
* ``qwen_mtp`` (Qwen3.5, ``mtp_num_hidden_layers``; vLLM's ``Qwen3NextMultiTokenPredictor``): per MTP
  layer one full-attention decoder layer exactly as the text model's (its attention, MLP or MoE and two
  norms: counted from our own layer config), plus ``fc`` ``[D, 2D]`` (no bias) and three RMSNorms of D
  (``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``norm``); the embedding and LM head are shared.
* ``nextn_mtp`` (DeepSeek-V3, GLM-4.5/4.6/4.7, GLM-4.7-Flash; ``num_nextn_predict_layers``; the
  checkpoint's ``model.layers.{L}.*``): per MTP module one decoder layer exactly as the text model's last
  (MoE) layer, ``eh_proj`` ``[D, 2D]``, the RMSNorms ``enorm``, ``hnorm`` and ``shared_head.norm`` of D, and
  the checkpoint's own copies of the embedding and the LM head (``embed_tokens``, ``shared_head.head``,
  ``[V, D]`` each). GLM-4.7-Flash's safetensors hold 31,221,488,576 parameters: its text model
  (29,943,393,920) plus one such module (1,278,094,656), to the parameter; DeepSeek-V3's 685B are its
  671B and a 14B module.

A part without a counter, or whose counter cannot read its config (a field missing or of another
shape), is named with ``params`` None and the reason: never estimated. The counters equal the sum of
transformers' own tower parameters built from the same config (``tests/test_towers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from storelab.checkpoint.shards import CheckpointError

__all__ = ["Part", "parts", "total", "note", "VISION", "MTP"]


@dataclass(frozen=True)
class Part:
    """One part of a checkpoint that storelab does not build: ``params`` None when it is not counted
    (``why`` says why); ``source`` is the config field it is read from."""

    name: str
    kind: str            # vision, audio, mtp
    source: str
    params: int | None
    why: str = ""


def _int(d: dict, key: str, default: int | None = None, where: str = "vision_config") -> int:
    """A positive integer field (transformers' default when the file leaves it out and one is given)."""
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise CheckpointError(f"{where}.{key}: expected a positive integer, got {v!r}")
    return v


def _block(H: int, I: int) -> int:
    """A ViT block with biases everywhere: two LayerNorms, q, k, v and out [H, H], an MLP of I."""
    return 2 * 2 * H + 4 * (H * H + H) + (H * I + I) + (I * H + H)


def qwen_vision(v: dict, *, deepstack: bool) -> int:
    """Qwen3-VL's / Qwen3.5's vision tower with its merger (and Qwen3-VL's deepstack mergers), from
    ``vision_config``; defaults as transformers' configs (Qwen3.5's tower builds no deepstack merger)."""
    H, I, L = _int(v, "hidden_size", 1152), _int(v, "intermediate_size", 4304), _int(v, "depth", 27)
    C, p, tp = _int(v, "in_channels", 3), _int(v, "patch_size", 16), _int(v, "temporal_patch_size", 2)
    m, O, N = _int(v, "spatial_merge_size", 2), _int(v, "out_hidden_size", 3584), _int(v, "num_position_embeddings",
                                                                                      2304)
    stack = v.get("deepstack_visual_indexes", (8, 16, 24) if deepstack else ())
    if not isinstance(stack, (list, tuple)):
        raise CheckpointError(f"vision_config.deepstack_visual_indexes: expected a list, got {stack!r}")
    if stack and not deepstack:
        raise CheckpointError(f"vision_config.deepstack_visual_indexes: {list(stack)}, but Qwen3.5's vision tower "
                              "builds no deepstack merger (what the checkpoint holds for them is unknown)")
    W = H * m * m

    def merger(norm: int) -> int:
        return 2 * norm + (W * W + W) + (W * O + O)

    embed = H * C * tp * p * p + H + N * H
    return embed + L * _block(H, I) + merger(H) + len(stack) * merger(W)


def siglip_vision(v: dict, *, head_default: bool = True) -> int:
    """SigLIP's vision transformer, from ``vision_config`` (transformers' SiglipVisionConfig defaults)."""
    H, I, L = _int(v, "hidden_size", 768), _int(v, "intermediate_size", 3072), _int(v, "num_hidden_layers", 12)
    C, p, S = _int(v, "num_channels", 3), _int(v, "patch_size", 16), _int(v, "image_size", 224)
    tower = H * C * p * p + H + (S // p) ** 2 * H + L * _block(H, I) + 2 * H
    if v.get("vision_use_head", head_default):   # attention pooling: probe, in/out projections, LayerNorm, MLP
        tower += H + (3 * H * H + 3 * H) + (H * H + H) + 2 * H + (H * I + I) + (I * H + H)
    return tower


def gemma3_vision(hf: dict) -> int:
    """Gemma 3's SigLIP tower (no pooling head unless its config says so) and its projector: the matrix
    [vision hidden, text hidden] and an RMSNorm of the vision width."""
    v = hf.get("vision_config") or {}
    H = _int(v, "hidden_size", 768)
    text = _int(hf.get("text_config") or {}, "hidden_size", 2304, where="text_config")  # Gemma3TextConfig's
    return siglip_vision(v, head_default=False) + H * text + H


def _family_counter(module: str) -> Callable[[dict], int]:
    """A family's own ``vision_params(hf)`` (its tower and projector), imported when asked for."""
    def count(hf: dict) -> int:
        import importlib

        return importlib.import_module(f"storelab.checkpoint.families.{module}").vision_params(hf)

    return count


# the wrapper's model_type -> the count of its vision tower (and projector) from the whole config.json
VISION: dict[str, Callable[[dict], int]] = {
    "qwen3_5": lambda hf: qwen_vision(hf["vision_config"], deepstack=False),
    "qwen3_5_moe": lambda hf: qwen_vision(hf["vision_config"], deepstack=False),
    "qwen3_vl": lambda hf: qwen_vision(hf["vision_config"], deepstack=True),
    "qwen3_vl_moe": lambda hf: qwen_vision(hf["vision_config"], deepstack=True),
    "gemma3": gemma3_vision,
    "kimi_k3": _family_counter("kimi_linear"),
    "minimax_m3_vl": _family_counter("minimax_m3_vl"),
    "llama4": _family_counter("llama4"),
}
AUDIO: dict[str, Callable[[dict], int]] = {}


def _text(hf: dict) -> dict:
    t = hf.get("text_config")
    return t if isinstance(t, dict) else hf


def qwen_mtp(hf: dict, cfg) -> int:
    """Qwen3.5's MTP layers (``mtp_num_hidden_layers``), each a full-attention layer of the text model,
    plus ``fc`` [D, 2D] and three RMSNorms of D (see the module docstring)."""
    n = _text(hf).get("mtp_num_hidden_layers", 0)
    full = [lay for lay, kind in zip(cfg.layers, _text(hf).get("layer_types") or []) if kind == "full_attention"]
    if not full:
        full = [lay for lay in cfg.layers if not lay.token.RECURRENT]
    if not full:
        raise CheckpointError("layer_types: no full-attention layer to count the MTP layer after")
    lay, D = full[0], cfg.d_model
    layer = lay.n_norms() * D + sum(st.num_params().stored for st in lay.stores().values())
    return n * layer + 2 * D * D + 3 * D


def nextn_mtp(hf: dict, cfg) -> int:
    """DeepSeek-V3's and GLM-4.5's MTP modules (``num_nextn_predict_layers``), each the text model's last
    layer, ``eh_proj`` [D, 2D], three RMSNorms of D and its stored copies of the embedding and LM head
    [V, D] (see the module docstring)."""
    n = _text(hf).get("num_nextn_predict_layers", 0)
    lay, D = cfg.layers[-1], cfg.d_model
    layer = lay.n_norms() * D + sum(st.num_params().stored for st in lay.stores().values())
    return n * (layer + 2 * D * D + 3 * D + 2 * cfg.vocab_size * D)


# the model_type (wrapper or text) -> its MTP layers' count, from config.json and our text model's config
MTP: dict[str, Callable[[dict, object], int]] = {
    **{t: qwen_mtp for t in ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")},
    **{t: nextn_mtp for t in ("deepseek_v3", "glm4_moe", "glm4_moe_lite")},
}
MTP_FIELDS = ("mtp_num_hidden_layers", "num_nextn_predict_layers", "num_mtp_modules")


def _counted(name: str, kind: str, source: str, count: Callable[[], int]) -> Part:
    try:
        return Part(name, kind, source, int(count()))
    except (CheckpointError, ValueError, TypeError, KeyError) as e:
        return Part(name, kind, source, None, f"its config cannot be counted exactly: {e}")


def parts(hf: dict, cfg) -> list[Part]:
    """The vision and audio towers (``vision_config``, ``audio_config``) and the MTP layers (``MTP_FIELDS``
    of the text config) of a checkpoint's config.json, counted where a counter reads them, else named."""
    mt = hf.get("model_type")
    out = []
    for kind, table in (("vision", VISION), ("audio", AUDIO)):
        key = f"{kind}_config"
        if not hf.get(key):
            continue
        tower = (hf[key].get("model_type") if isinstance(hf[key], dict) else None) or mt
        name = f"{kind} tower ({tower})"
        if mt in table:
            out.append(_counted(name, kind, key, lambda: table[mt](hf)))
        else:
            out.append(Part(name, kind, key, None, f"no counter for the {kind} tower of model_type {mt!r}"))
    t = _text(hf)
    declared = [k for k in MTP_FIELDS if isinstance(t.get(k), int) and not isinstance(t.get(k), bool) and t[k] > 0]
    if declared:
        name = f"MTP layers ({declared[0]}: {t[declared[0]]})"
        text_type = t.get("model_type") or mt
        count = MTP.get(mt) or MTP.get(text_type)
        if count is not None:
            out.append(_counted(name, "mtp", declared[0], lambda: count(hf, cfg)))
        else:
            out.append(Part(name, "mtp", declared[0], None, f"no counter for the MTP layers of model_type {mt!r}"))
    return out


def total(cfg, found: list[Part]) -> tuple[int, list[str]]:
    """(the text model's stored parameters plus every counted part, the names of the parts not counted)."""
    from storelab.models.accounting import count_params

    return (count_params(cfg).stored + sum(p.params for p in found if p.params is not None),
            [p.name for p in found if p.params is None])


def note(found: list[Part]) -> str:
    """One line: each part with its parameters, or 'not counted'."""
    return "; ".join(f"{p.name}, not built, counted apart from {p.source}: "
                     + (f"{p.params:,} parameters" if p.params is not None else f"not counted ({p.why})")
                     for p in found)
