"""A test-side transformers -> GGUF writer for the hybrid and MLA architectures, the way llama.cpp's converter
writes them (``conversion/*.py``: each class's ``set_gguf_parameters`` and ``modify_tensors``, summarised per
architecture below), so that ``storelab.checkpoint.gguf`` can be held to transformers' own model.

    write_gguf(folder, arch, path)   # folder: save_pretrained output (config.json + model.safetensors)

Tensor names come from gguf-py (``gguf.get_tensor_name_map``, ``gguf.TENSOR_NAMES``); tensors are written in
f32 (no quantisation: the round trip must be exact). This is test code mirroring the converter, not the
converter: only what the tiny models of ``tests/test_gguf_hybrid.py`` hold is covered.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import torch
from gguf.constants import MODEL_ARCH, MODEL_TENSOR as T, TENSOR_NAMES
from safetensors.torch import load_file

__all__ = ["write_gguf", "CONVERTERS"]


class Out:
    """What one conversion produces: metadata (``{arch}.`` keys without the prefix) and GGUF tensors."""

    def __init__(self, arch: MODEL_ARCH, cfg: dict, n_blocks: int):
        self.arch, self.cfg = arch, cfg
        self.name = gguf.MODEL_ARCH_NAMES[arch]
        self.meta: dict[str, object] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        self.map = gguf.get_tensor_name_map(arch, n_blocks)

    def put(self, key: str, value) -> None:
        self.meta[key] = value

    def add(self, hf_name: str, t: torch.Tensor) -> None:
        """Under the GGUF name gguf-py maps ``hf_name`` to (``e_score_correction_bias`` renamed first, as
        ``ModelBase.filter_tensors`` does)."""
        hf_name = hf_name.replace("e_score_correction_bias", "e_score_correction.bias")
        name = self.map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"gguf-py maps no name of {self.name} onto {hf_name!r}")
        self.tensors[name] = t

    def raw(self, kind: T, bid: int | None, t: torch.Tensor, suffix: str = ".weight") -> None:
        name = TENSOR_NAMES[kind]
        self.tensors[(name.format(bid=bid) if bid is not None else name) + suffix] = t


def _put_kv(w: gguf.GGUFWriter, key: str, v) -> None:
    if isinstance(v, bool):
        w.add_bool(key, v)
    elif isinstance(v, int):
        w.add_uint32(key, v)
    elif isinstance(v, float):
        w.add_float32(key, v)
    elif isinstance(v, str):
        w.add_string(key, v)
    elif isinstance(v, (list, tuple)):
        w.add_array(key, list(v))
    else:
        raise TypeError(f"{key}: {v!r}")


def merge_experts(sd: dict) -> dict:
    """Per-expert ``...experts.{e}.{w}.weight`` stacked into ``...experts.{w}.weight`` [E, ...], as the
    converters' ``_experts`` buffers do (``Qwen2MoeModel``, ``DeepseekV2Model``, ...)."""
    out, groups = {}, {}
    pat = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")
    for name, t in sd.items():
        m = pat.match(name)
        if m is None:
            out[name] = t
        else:
            groups.setdefault(f"{m[1]}.{m[3]}.weight", {})[int(m[2])] = t
    for name, per in groups.items():
        out[name] = torch.stack([per[e] for e in range(len(per))])
    return out


def write_gguf(folder: Path, arch: str, path: Path) -> Path:
    cfg = json.loads((Path(folder) / "config.json").read_text())
    sd = merge_experts(load_file(str(Path(folder) / "model.safetensors")))
    out = CONVERTERS[arch](cfg, sd)
    w = gguf.GGUFWriter(path, out.name)
    for k, v in out.meta.items():
        _put_kv(w, k if k.startswith("general.") else f"{out.name}.{k}", v)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for name, t in out.tensors.items():
        w.add_tensor(name, np.ascontiguousarray(t.detach().to(torch.float32).numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- the metadata every decoder gets (conversion/base.py TextModel.set_gguf_parameters) -------------------

def _rope(cfg: dict) -> dict:
    return cfg.get("rope_parameters") or {}


def text_meta(o: Out, n_blocks: int) -> None:
    c = o.cfg
    o.put("block_count", n_blocks)
    if "max_position_embeddings" in c:
        o.put("context_length", c["max_position_embeddings"])
    o.put("embedding_length", c["hidden_size"])
    for k in ("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size"):
        if c.get(k) is not None:
            o.put("feed_forward_length", c[k])
            break
    if c.get("num_attention_heads") is not None:
        o.put("attention.head_count", c["num_attention_heads"])
    if c.get("num_key_value_heads") is not None:
        o.put("attention.head_count_kv", c["num_key_value_heads"])
    rp = _rope(c)
    if rp.get("rope_type") == "yarn":
        o.put("rope.scaling.type", "yarn")
        o.put("rope.scaling.factor", float(rp["factor"]))
        o.put("rope.scaling.original_context_length", rp["original_max_position_embeddings"])
        for key, gk in (("beta_fast", "rope.scaling.yarn_beta_fast"), ("beta_slow", "rope.scaling.yarn_beta_slow")):
            if rp.get(key) is not None:
                o.put(gk, float(rp[key]))
    if "mrope_section" in rp:
        o.put("rope.dimension_sections", (list(rp["mrope_section"]) + [0, 0, 0, 0])[:4])
    if rp.get("rope_theta") is not None:
        o.put("rope.freq_base", float(rp["rope_theta"]))
    for k in ("rms_norm_eps", "norm_eps"):
        if c.get(k) is not None:
            o.put("attention.layer_norm_rms_epsilon", float(c[k]))
            break
    for k in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"):
        if c.get(k) is not None:
            o.put("attention.layer_norm_epsilon", float(c[k]))
            break
    for k in ("num_local_experts", "num_experts", "n_routed_experts"):
        if c.get(k) is not None:
            o.put("expert_count", c[k])
            break
    for k in ("num_experts_per_tok", "num_experts_per_token", "top_k_experts"):
        if c.get(k) is not None:
            o.put("expert_used_count", c[k])
            break
    if c.get("n_group") is not None:
        o.put("expert_group_count", c["n_group"])
    if c.get("topk_group") is not None:
        o.put("expert_group_used_count", c["topk_group"])
    for k in ("score_function", "scoring_func", "score_func", "moe_router_activation", "moe_router_activation_func"):
        if c.get(k) is not None:
            o.put("expert_gating_func", {"softmax": 1, "sigmoid": 2}[c[k]])
            break
    if c.get("head_dim") is not None:
        o.put("attention.key_length", c["head_dim"])
        o.put("attention.value_length", c["head_dim"])


def _experts(o: Out, name: str, t: torch.Tensor) -> bool:
    """transformers v5's 3-D experts (``Qwen2MoeModel.modify_tensors``): gate_up_proj split, down_proj kept."""
    if name.endswith("experts.gate_up_proj"):
        n = t.shape[-2] // 2
        base = name.removesuffix(".gate_up_proj")
        o.add(f"{base}.gate_proj.weight", t[..., :n, :])
        o.add(f"{base}.up_proj.weight", t[..., n:, :])
        return True
    if name.endswith("experts.down_proj"):
        o.add(f"{name}.weight", t)
        return True
    return False


# ---- Qwen3-Next / Qwen3.5 (conversion/qwen.py) -------------------------------------------------------------

def _qwen_linear_meta(o: Out, c: dict) -> None:
    if c.get("moe_intermediate_size") is not None:
        o.put("expert_feed_forward_length", c["moe_intermediate_size"])
    if c.get("shared_expert_intermediate_size") is not None:
        o.put("expert_shared_feed_forward_length", c["shared_expert_intermediate_size"])
    o.put("ssm.conv_kernel", c["linear_conv_kernel_dim"])
    o.put("ssm.state_size", c["linear_key_head_dim"])
    o.put("ssm.group_count", c["linear_num_key_heads"])
    o.put("ssm.time_step_rank", c["linear_num_value_heads"])
    o.put("ssm.inner_size", c["linear_value_head_dim"] * c["linear_num_value_heads"])
    if c.get("layer_types") is not None:
        o.put("attention.recurrent_layers", [t == "linear_attention" for t in c["layer_types"]])
    o.put("full_attention_interval", c.get("full_attention_interval", 4))
    o.put("rope.dimension_count", int(c["head_dim"] * _rope(c).get("partial_rotary_factor", 0.25)))


def _qwen_common_tensor(o: Out, name: str, t: torch.Tensor) -> torch.Tensor:
    if name.endswith(".A_log"):
        return -torch.exp(t)
    if "conv1d" in name:
        return t.squeeze()
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return t + 1
    return t


def _qwen_name(name: str) -> str:
    return name.rpartition(".dt_bias")[0] + ".dt_proj.bias" if name.endswith(".dt_bias") else name


def qwen3next(cfg: dict, sd: dict) -> Out:
    n = cfg["num_hidden_layers"]
    o = Out(MODEL_ARCH.QWEN3NEXT, cfg, n)
    text_meta(o, n)
    _qwen_linear_meta(o, cfg)
    H, K, HV, V = (cfg[k] for k in ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
                                   "linear_value_head_dim"))
    for name, t in sd.items():
        t = _qwen_common_tensor(o, name, t)
        if _experts(o, name, t):
            continue
        if "in_proj_qkvz.weight" in name:
            bid = int(name.split(".")[2])
            sizes = [K, K, HV // H * V, HV // H * V]
            x = t.permute(1, 0).contiguous().view(-1, H, sum(sizes))
            q, k, v, z = torch.split(x, sizes, dim=-1)
            D = cfg["hidden_size"]
            qkv = torch.cat([q.reshape(D, -1), k.reshape(D, -1), v.reshape(D, -1)], dim=-1).permute(1, 0)
            o.raw(T.ATTN_QKV, bid, qkv)
            o.raw(T.ATTN_GATE, bid, z.reshape(D, -1).permute(1, 0))
            continue
        o.add(_qwen_name(name), t)
    return o


def _tile(t: torch.Tensor, dim: int, H: int, r: int, d: int) -> torch.Tensor:
    """``_LinearAttentionVReorderBase._reorder_v_heads``: grouped (H, r, d) -> tiled (r, H, d) along dim."""
    shape = list(t.shape)
    dim %= len(shape)
    x = t.reshape(*shape[:dim], H, r, d, *shape[dim + 1:])
    return x.transpose(dim, dim + 1).contiguous().reshape(shape)


def _qwen35(arch: MODEL_ARCH) -> Callable[[dict, dict], Out]:
    def convert(cfg: dict, sd: dict) -> Out:
        n = cfg["num_hidden_layers"]
        o = Out(arch, cfg, n)
        text_meta(o, n)
        _qwen_linear_meta(o, cfg)
        H, K, HV, V = (cfg[k] for k in ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
                                       "linear_value_head_dim"))
        r = HV // H
        for name, t in sd.items():
            if r > 1 and "linear_attn." in name:
                if ".in_proj_qkv." in name:
                    t = torch.cat([t[:2 * H * K], _tile(t[2 * H * K:], 0, H, r, V)])
                elif ".in_proj_z." in name:
                    t = _tile(t, 0, H, r, V)
                elif ".in_proj_b." in name or ".in_proj_a." in name:
                    t = _tile(t, 0, H, r, 1)
                elif ".A_log" in name or ".dt_bias" in name:
                    t = _tile(t.unsqueeze(-1), 0, H, r, 1).squeeze(-1)
                elif ".conv1d" in name:
                    t = t.squeeze()
                    t = torch.cat([t[:2 * H * K], _tile(t[2 * H * K:], 0, H, r, V)])
                elif ".out_proj." in name:
                    t = _tile(t, 1, H, r, V)
            t = _qwen_common_tensor(o, name, t)
            if _experts(o, name, t):
                continue
            o.add(_qwen_name(name), t)
        return o

    return convert


CONVERTERS: dict[str, Callable[[dict, dict], Out]] = {
    "qwen3next": qwen3next,
    "qwen35": _qwen35(MODEL_ARCH.QWEN35),
    "qwen35moe": _qwen35(MODEL_ARCH.QWEN35MOE),
}


# ---- Mamba-2 and its hybrids (conversion/mamba.py, granite.py, nemotron.py) --------------------------------

def _mamba2_tensor(o: Out, name: str, t: torch.Tensor, n_group: int) -> None:
    """``Mamba2Model.filter_tensors`` / ``modify_tensors``: dt_bias renamed, conv squeezed, A and D [H, 1],
    the norm [groups, d / groups], A = -exp(A_log)."""
    if name.endswith(".dt_bias"):
        name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    if name.endswith("conv1d.weight"):
        t = t.squeeze()
    elif name.endswith((".A_log", ".D")):
        t = t.reshape(*t.shape, 1)
    elif name.endswith("mixer.norm.weight") or name.endswith("mamba.norm.weight"):
        t = t.reshape(n_group, -1)
    if name.endswith(".A_log"):
        t = -torch.exp(t)
    o.add(name, t)


def _ssm_meta(o: Out, conv: int, state: int, groups: int, inner: int, heads: int) -> None:
    o.put("ssm.conv_kernel", conv)
    o.put("ssm.inner_size", inner)
    o.put("ssm.state_size", state)
    o.put("ssm.time_step_rank", heads)
    o.put("ssm.group_count", groups)


def mamba2(cfg: dict, sd: dict) -> Out:
    n = cfg["num_hidden_layers"]
    o = Out(MODEL_ARCH.MAMBA2, cfg, n)
    D = cfg["hidden_size"]
    inner = cfg.get("expand", 2) * D
    o.put("context_length", 2 ** 20)
    o.put("embedding_length", D)
    o.put("feed_forward_length", 0)
    o.put("attention.head_count", 0)
    o.put("block_count", n)
    _ssm_meta(o, cfg["conv_kernel"], cfg["state_size"], cfg["n_groups"], inner, inner // cfg["head_dim"])
    o.put("attention.layer_norm_rms_epsilon", float(cfg.get("layer_norm_epsilon", 1e-5)))
    for name, t in sd.items():
        _mamba2_tensor(o, name, t, cfg["n_groups"])
    return o


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """``LlamaModel.permute``: each head's rows from half-split RoPE pairs to interleaved ones."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _attn_tensor(o: Out, name: str, t: torch.Tensor, H: int, KV: int) -> None:
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        t = _permute(t, H)
    elif name.endswith(("k_proj.weight", "k_proj.bias")):
        t = _permute(t, KV)
    o.add(name, t)


def nemotron_h(cfg: dict, sd: dict) -> Out:
    types = cfg["layers_block_type"]
    n = len(types)
    moe = "num_experts_per_tok" in cfg
    o = Out(MODEL_ARCH.NEMOTRON_H_MOE if moe else MODEL_ARCH.NEMOTRON_H, cfg, n)
    text_meta(o, n)
    attn = [i for i, x in enumerate(types) if x in ("attention", "full_attention")]
    mlp = [i for i, x in enumerate(types) if x == "moe"] if moe else [i for i, x in enumerate(types) if x == "mlp"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    o.put("attention.head_count_kv", [KV if i in attn else 0 for i in range(n)])
    o.put("attention.key_length", cfg["head_dim"])
    o.put("attention.value_length", cfg["head_dim"])
    inner = cfg["mamba_num_heads"] * cfg["mamba_head_dim"]
    _ssm_meta(o, cfg["conv_kernel"], cfg["ssm_state_size"], cfg["n_groups"], inner, cfg["mamba_num_heads"])
    ff = cfg["moe_intermediate_size"] if moe else cfg["intermediate_size"]
    o.put("feed_forward_length", [ff if i in mlp else 0 for i in range(n)])
    if moe:
        o.put("expert_feed_forward_length", cfg["moe_intermediate_size"])
        o.put("expert_shared_feed_forward_length", cfg["moe_shared_expert_intermediate_size"])
        o.put("expert_count", cfg["n_routed_experts"])
        o.put("expert_shared_count", cfg["n_shared_experts"])
        o.put("expert_weights_norm", bool(cfg["norm_topk_prob"]))
        o.put("expert_weights_scale", float(cfg["routed_scaling_factor"]))
        o.put("expert_group_count", cfg["n_group"])
        if cfg.get("moe_latent_size") is not None:
            o.put("moe_latent_size", cfg["moe_latent_size"])
    for name, t in sd.items():
        if ".mixer." in name and int(name.split(".")[2]) in attn:
            _attn_tensor(o, name, t, H, KV)
        elif ".mixer.experts." in name:
            bid = int(name.split(".")[2])
            o.add(name.replace(f"backbone.layers.{bid}.mixer.experts", f"model.layers.{bid}.mlp.experts")
                  + ("" if name.endswith(".weight") else ".weight"), t)
        else:
            _mamba2_tensor(o, name, t, cfg["n_groups"])
    return o


def granitehybrid(cfg: dict, sd: dict) -> Out:
    n = cfg["num_hidden_layers"]
    o = Out(MODEL_ARCH.GRANITE_HYBRID, cfg, n)
    c = {k: v for k, v in cfg.items() if k != "head_dim"}   # GraniteModel.set_gguf_parameters pops head_dim
    o.cfg = c
    text_meta(o, n)
    for key, gk in (("attention_multiplier", "attention.scale"), ("embedding_multiplier", "embedding_scale"),
                    ("residual_multiplier", "residual_scale"), ("logits_scaling", "logit_scale")):
        if cfg.get(key):
            o.put(gk, float(cfg[key]))
    experts = bool(cfg.get("num_local_experts"))
    if cfg.get("shared_intermediate_size"):
        o.put("expert_shared_feed_forward_length", cfg["shared_intermediate_size"])
    # get_attn_layers: "attention" in published configs; transformers 5 saves "full_attention"
    attn = [i for i, x in enumerate(cfg["layer_types"]) if x in ("attention", "full_attention")]
    inner = cfg["mamba_expand"] * cfg["hidden_size"]
    _ssm_meta(o, cfg["mamba_d_conv"], cfg["mamba_d_state"], cfg["mamba_n_groups"], inner, cfg["mamba_n_heads"])
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    o.put("attention.head_count_kv", [KV if i in attn else 0 for i in range(n)])
    o.put("rope.scaling.finetuned", not [i for i in range(n) if i not in attn])
    for name, t in sd.items():
        bid = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if name.endswith("block_sparse_moe.input_linear.weight"):
            I = cfg["intermediate_size"]
            o.raw(T.FFN_GATE_EXP, bid, t[:, :I])
            o.raw(T.FFN_UP_EXP, bid, t[:, I:])
        elif name.endswith("shared_mlp.input_linear.weight"):
            S = cfg["shared_intermediate_size"]
            o.raw(T.FFN_GATE_SHEXP if experts else T.FFN_GATE, bid, t[:S])
            o.raw(T.FFN_UP_SHEXP if experts else T.FFN_UP, bid, t[S:])
        elif name.endswith("shared_mlp.output_linear.weight") and not experts:
            o.raw(T.FFN_DOWN, bid, t)
        elif ".self_attn." in name:
            _attn_tensor(o, name, t, H, KV)
        else:
            _mamba2_tensor(o, name, t, cfg["mamba_n_groups"])
    return o


CONVERTERS.update({"mamba2": mamba2, "nemotron_h": nemotron_h, "nemotron_h_moe": nemotron_h,
                   "granitehybrid": granitehybrid})


# ---- DeepSeek-V2 / V3, GLM-4.5, MiniMax-M2 (conversion/deepseek.py, glm.py, minimax.py) ----------------------

def deepseek2(cfg: dict, sd: dict) -> Out:
    n = cfg["num_hidden_layers"]
    c = dict(cfg)
    if c["model_type"] == "deepseek_v3":
        c.setdefault("scoring_func", "sigmoid")      # the published V3 config.json says so
    H_kv = c["num_key_value_heads"]
    c["num_key_value_heads"] = 1                     # MLA written as MQA
    o = Out(MODEL_ARCH.DEEPSEEK2, c, n)
    text_meta(o, n)
    has_moe = c.get("n_routed_experts") is not None
    o.put("leading_dense_block_count", c.get("first_k_dense_replace") or (0 if has_moe else n))
    o.put("vocab_size", c["vocab_size"])
    if c.get("q_lora_rank") is not None:
        o.put("attention.q_lora_rank", c["q_lora_rank"])
    kv = c.get("kv_lora_rank", 512)
    o.put("attention.kv_lora_rank", kv)
    o.put("attention.key_length", kv + c["qk_rope_head_dim"])
    o.put("attention.value_length", kv)
    o.put("attention.key_length_mla", c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    o.put("attention.value_length_mla", c["v_head_dim"])
    o.put("expert_feed_forward_length", c.get("moe_intermediate_size") or c["intermediate_size"])
    if has_moe:
        o.put("expert_count", c["n_routed_experts"])
    o.put("expert_shared_count", c.get("n_shared_experts", 0))
    if c.get("routed_scaling_factor") is not None:
        o.put("expert_weights_scale", float(c["routed_scaling_factor"]))
    if c.get("norm_topk_prob"):
        o.put("expert_weights_norm", True)
    o.put("rope.dimension_count", c["qk_rope_head_dim"])
    rp = _rope(c)
    if rp.get("mscale_all_dim") is not None:
        o.put("rope.scaling.yarn_log_multiplier", 0.1 * rp["mscale_all_dim"])
    nope, v = c["qk_nope_head_dim"], c["v_head_dim"]
    for name, t in sd.items():
        if _experts(o, name, t):
            continue
        if name.endswith("kv_b_proj.weight"):
            bid = int(name.split(".")[2])
            kv_b = t.view(H_kv, v + nope, t.shape[-1])
            k_b, v_b = torch.split(kv_b, [nope, v], dim=1)
            o.add(name.replace("kv_b_proj", "k_b_proj"), k_b.transpose(1, 2))
            o.add(name.replace("kv_b_proj", "v_b_proj"), v_b)
            continue
        o.add(name, t)
    return o


def glm4moe(cfg: dict, sd: dict) -> Out:
    n = cfg["num_hidden_layers"]
    o = Out(MODEL_ARCH.GLM4_MOE, cfg, n)
    text_meta(o, n)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    o.put("rope.dimension_count", int(hd * _rope(cfg).get("partial_rotary_factor", 0.5)))
    for key, gk in (("n_routed_experts", "expert_count"), ("moe_intermediate_size", "expert_feed_forward_length"),
                    ("n_shared_experts", "expert_shared_count"), ("first_k_dense_replace", "leading_dense_block_count")):
        if cfg.get(key) is not None:
            o.put(gk, cfg[key])
    o.put("expert_gating_func", 2)
    if cfg.get("routed_scaling_factor") is not None:
        o.put("expert_weights_scale", float(cfg["routed_scaling_factor"]))
    if cfg.get("norm_topk_prob") is not None:
        o.put("expert_weights_norm", bool(cfg["norm_topk_prob"]))
    for name, t in sd.items():
        if not _experts(o, name, t):
            o.add(name, t)
    return o


def minimax_m2(cfg: dict, sd: dict) -> Out:
    n = cfg["num_hidden_layers"]
    c = dict(cfg, scoring_func=cfg.get("scoring_func", "sigmoid"))   # the published config.json says so
    o = Out(MODEL_ARCH.MINIMAXM2, c, n)
    text_meta(o, n)
    o.put("expert_feed_forward_length", cfg["intermediate_size"])
    o.put("rope.dimension_count", cfg["rotary_dim"])
    for name, t in sd.items():   # the experts' w1 / w2 / w3 already stacked (merge_experts)
        o.add(name, t)
    return o


CONVERTERS.update({"deepseek2": deepseek2, "glm4moe": glm4moe, "minimax-m2": minimax_m2})


# ---- Jamba, Kimi Linear, GLM-5 (DSA), MiMo-V2-Flash (conversion/jamba.py, kimi_linear.py, glm.py, mimo.py) ----

def _bid(name: str) -> int | None:
    return int(name.split(".")[2]) if name.startswith("model.layers.") else None


def jamba(cfg: dict, sd: dict) -> Out:
    """``JambaModel``: per-layer KV heads from the attention period, Mamba's conv squeezed, A = -exp(A_log)."""
    n, D = cfg["num_hidden_layers"], cfg["hidden_size"]
    o = Out(MODEL_ARCH.JAMBA, cfg, n)
    off, per = cfg["attn_layer_offset"], cfg["attn_layer_period"]
    o.put("block_count", n)
    o.put("context_length", cfg["max_position_embeddings"])
    o.put("embedding_length", D)
    o.put("feed_forward_length", cfg["intermediate_size"])
    o.put("attention.head_count", cfg["num_attention_heads"])
    o.put("attention.head_count_kv", [cfg["num_key_value_heads"] if i >= off and (i - off) % per == 0 else 0
                                      for i in range(n)])
    o.put("ssm.conv_kernel", cfg.get("mamba_d_conv") or 4)
    o.put("ssm.inner_size", cfg["mamba_expand"] * D)
    o.put("ssm.state_size", cfg.get("mamba_d_state") or 16)
    rank = cfg.get("mamba_dt_rank")
    o.put("ssm.time_step_rank", rank if isinstance(rank, int) else -(D // -16))
    o.put("attention.layer_norm_rms_epsilon", float(cfg.get("rms_norm_eps") or 1e-6))
    o.put("expert_count", cfg["num_experts"])
    o.put("expert_used_count", cfg["num_experts_per_tok"])
    for name, t in sd.items():
        if _experts(o, name.replace(".feed_forward.experts.", ".mlp.experts."), t):
            continue
        if name.endswith("conv1d.weight"):
            t = t.squeeze()
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        o.add(name, t)
    return o


def kimi_linear(cfg: dict, sd: dict) -> Out:
    """``KimiLinearModel``: MLA as MQA (head_count_kv 1 on MLA layers, 0 on KDA layers), kv_b split, KDA convs
    as (1, C, 1, W), A = -exp(A_log), dt_bias as dt_proj.bias; the published config's fields (linear_attn_config,
    model_max_length, moe_router_activation_func) from transformers' saved ones."""
    n = cfg["num_hidden_layers"]
    full = [i + 1 for i, x in enumerate(cfg["layer_types"]) if x == "full_attention"]
    H_kv = cfg["num_key_value_heads"]
    c = {k: v for k, v in cfg.items() if k != "head_dim"}     # the published config.json has no head_dim
    c.update(num_key_value_heads=1, max_position_embeddings=cfg["model_max_length"],
             moe_router_activation_func="sigmoid", n_group=cfg.get("num_expert_group"))
    o = Out(MODEL_ARCH.KIMI_LINEAR, c, n)
    text_meta(o, n)
    o.put("vocab_size", c["vocab_size"])
    o.put("attention.head_count_kv", [1 if i + 1 in full else 0 for i in range(n)])
    o.put("ssm.conv_kernel", cfg["linear_conv_kernel_dim"])
    o.put("kda.head_dim", cfg["linear_head_dim"])
    if cfg.get("q_lora_rank") is not None:
        o.put("attention.q_lora_rank", cfg["q_lora_rank"])
    kv = cfg["kv_lora_rank"]
    o.put("attention.kv_lora_rank", kv)
    o.put("rope.dimension_count", cfg["qk_rope_head_dim"])
    o.put("attention.key_length", kv + cfg["qk_rope_head_dim"])
    o.put("attention.key_length_mla", cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
    o.put("attention.value_length_mla", cfg["v_head_dim"])
    o.put("expert_feed_forward_length", cfg["moe_intermediate_size"])
    o.put("expert_shared_count", cfg["num_shared_experts"])
    o.put("leading_dense_block_count", cfg["mlp_layer_types"].index("sparse"))
    o.put("expert_weights_scale", float(cfg["routed_scaling_factor"]))
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    for name, t in sd.items():
        bid = _bid(name)
        if name.endswith(("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")):
            t = t.reshape(1, t.shape[0], 1, t.shape[-1])
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        if name.endswith(".dt_bias"):
            name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
        if name.endswith("kv_b_proj.weight"):
            k_b, v_b = torch.split(t.view(H_kv, nope + v, t.shape[-1]), [nope, v], dim=1)
            o.raw(T.ATTN_K_B, bid, k_b.transpose(1, 2))
            o.raw(T.ATTN_V_B, bid, v_b)
            continue
        if ".block_sparse_moe.experts." in name:     # w1 / w3 / w2 stacked by merge_experts
            kind = {"w1": T.FFN_GATE_EXP, "w3": T.FFN_UP_EXP, "w2": T.FFN_DOWN_EXP}[name.split(".")[-2]]
            o.raw(kind, bid, t)
            continue
        if ".block_sparse_moe." in name and bid is not None and name.endswith(("gate_proj.weight", "up_proj.weight",
                                                                               "down_proj.weight")):
            name = name.replace(".block_sparse_moe.", ".mlp.")
        o.add(name, t)
    return o


def _mla_convert(arch: MODEL_ARCH, cfg: dict, sd: dict, extra: Callable[[Out, dict], None] | None = None) -> Out:
    """``DeepseekV2Model`` (deepseek2, and glm-dsa through ``GlmMoeDsaModel``): MLA as MQA, kv_b split."""
    n = cfg["num_hidden_layers"]
    c = dict(cfg)
    H_kv = c["num_key_value_heads"]
    c["num_key_value_heads"] = 1
    o = Out(arch, c, n)
    text_meta(o, n)
    has_moe = c.get("n_routed_experts") is not None
    o.put("leading_dense_block_count", c.get("first_k_dense_replace") or (0 if has_moe else n))
    o.put("vocab_size", c["vocab_size"])
    if c.get("q_lora_rank") is not None:
        o.put("attention.q_lora_rank", c["q_lora_rank"])
    kv = c.get("kv_lora_rank", 512)
    o.put("attention.kv_lora_rank", kv)
    o.put("attention.key_length", kv + c["qk_rope_head_dim"])
    o.put("attention.value_length", kv)
    o.put("attention.key_length_mla", c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    o.put("attention.value_length_mla", c["v_head_dim"])
    o.put("expert_feed_forward_length", c.get("moe_intermediate_size") or c["intermediate_size"])
    if has_moe:
        o.put("expert_count", c["n_routed_experts"])
    o.put("expert_shared_count", c.get("n_shared_experts", 0))
    if c.get("routed_scaling_factor") is not None:
        o.put("expert_weights_scale", float(c["routed_scaling_factor"]))
    if c.get("norm_topk_prob"):
        o.put("expert_weights_norm", True)
    o.put("rope.dimension_count", c["qk_rope_head_dim"])
    rp = _rope(c)
    if rp.get("mscale_all_dim") is not None:
        o.put("rope.scaling.yarn_log_multiplier", 0.1 * rp["mscale_all_dim"])
    if extra is not None:
        extra(o, c)
    nope, v = c["qk_nope_head_dim"], c["v_head_dim"]
    for name, t in sd.items():
        if _experts(o, name, t):
            continue
        if name.endswith("kv_b_proj.weight"):
            kv_b = t.view(H_kv, v + nope, t.shape[-1])
            k_b, v_b = torch.split(kv_b, [nope, v], dim=1)
            o.add(name.replace("kv_b_proj", "k_b_proj"), k_b.transpose(1, 2))
            o.add(name.replace("kv_b_proj", "v_b_proj"), v_b)
            continue
        o.add(name, t)
    return o


def glm_dsa(cfg: dict, sd: dict) -> Out:
    """``GlmMoeDsaModel``: deepseek2's MLA, the indexer's sizes and per-layer types (true = full)."""
    def extra(o: Out, c: dict) -> None:
        o.put("rope.dimension_count", int(c["qk_rope_head_dim"] * _rope(c).get("partial_rotary_factor", 1.0)))
        o.put("attention.indexer.head_count", c["index_n_heads"])
        o.put("attention.indexer.key_length", c["index_head_dim"])
        o.put("attention.indexer.top_k", c["index_topk"])
        if c.get("indexer_types") is not None:
            o.put("attention.indexer.types", [t == "full" for t in c["indexer_types"]])

    c = dict(cfg, scoring_func="sigmoid")        # the published GLM-5 config.json says so
    return _mla_convert(MODEL_ARCH.GLM_DSA, c, sd, extra)


def mimo2(cfg: dict, sd: dict) -> Out:
    """``MimoV2Model``: per-layer KV heads, window and its pattern, v_head_dim as value_length, the two rope
    bases, the value scale; sinks renamed ``attention_sink_bias.weight`` as the published checkpoint has them."""
    n = cfg["num_hidden_layers"]
    rp = cfg["rope_parameters"]
    c = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    o = Out(MODEL_ARCH.MIMO2, c, n)
    text_meta(o, n)
    swa = [t == "sliding_attention" for t in cfg["layer_types"]]
    G = cfg["num_key_value_heads"]
    o.put("attention.head_count_kv", [2 * G if x else G for x in swa])
    o.put("attention.sliding_window", cfg["sliding_window"])
    o.put("attention.sliding_window_pattern", [int(x) for x in swa])
    o.put("attention.value_length", cfg["v_head_dim"])
    o.put("expert_count", cfg["n_routed_experts"])
    o.put("expert_feed_forward_length", cfg["moe_intermediate_size"])
    o.put("rope.freq_base", float(rp["full_attention"]["rope_theta"]))
    o.put("rope.freq_base_swa", float(rp["sliding_attention"]["rope_theta"]))
    o.put("rope.dimension_count", int(cfg["head_dim"] * rp["full_attention"]["partial_rotary_factor"]))
    o.put("attention.value_scale", float(cfg["attention_value_scale"]))
    for name, t in sd.items():
        if _experts(o, name, t):
            continue
        if name.endswith(".self_attn.sinks"):
            name = name.replace(".sinks", ".attention_sink_bias")
        if "attention_sink" in name and not name.endswith(".weight"):
            name += ".weight"
        o.add(name, t)
    return o


CONVERTERS.update({"jamba": jamba, "kimi-linear": kimi_linear, "glm-dsa": glm_dsa, "mimo2": mimo2})
