"""A test-side transformers -> GGUF writer for the plain decoders (``storelab/checkpoint/gguf/archs.py``), the way
llama.cpp's converter writes them (``LlamaModel.permute`` on q/k, Gemma's ``norm_shift`` 1, experts as 3-D
``ffn_{gate,up,down}_exps``, gpt-oss's de-interleaved gate/up, Mamba's ``-exp(A_log)``, squeezed convolutions),
so that storelab's reader can be held to transformers' own model.

    write_gguf(hf_model, arch, path, qtype=None)   # qtype: quantize 2-D weights (Q8_0 ...), else F32

Names come from gguf-py (``gguf.get_tensor_name_map``, ``gguf.TENSOR_NAMES``): the writer and storelab's
reader share no code. Test code mirroring the converter for the tiny models only, not the converter.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
from gguf.constants import MODEL_ARCH, MODEL_TENSOR as T, TENSOR_NAMES

__all__ = ["write_gguf", "ARCH_OF"]

ARCH_OF = {"llama": MODEL_ARCH.LLAMA, "qwen2": MODEL_ARCH.QWEN2, "qwen3": MODEL_ARCH.QWEN3,
           "qwen2moe": MODEL_ARCH.QWEN2MOE, "qwen3moe": MODEL_ARCH.QWEN3MOE, "gemma2": MODEL_ARCH.GEMMA2,
           "gemma3": MODEL_ARCH.GEMMA3, "lfm2": MODEL_ARCH.LFM2, "gpt-oss": MODEL_ARCH.GPT_OSS,
           "mamba": MODEL_ARCH.MAMBA}


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute`` (n_head already the kv heads for k)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_freqs(c) -> torch.Tensor | None:
    """``LlamaModel.generate_extra_tensors``: a llama3 scaling as per-frequency factors ``rope_freqs.weight``. As the
    converter, the pretraining length is the config's top-level ``original_max_position_embeddings`` (8192 when
    absent), the rest from ``rope_parameters``."""
    import math

    rp = c.rope_parameters or {}
    if rp.get("rope_type") != "llama3":
        return None
    dim = c.head_dim or c.hidden_size // c.num_attention_heads
    freqs = 1.0 / (rp.get("rope_theta", 10000.0) ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rp.get("factor", 8.0), rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = c.to_dict().get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def _raw(kind: T, bid: int, suffix: str = ".weight") -> str:
    return TENSOR_NAMES[kind].format(bid=bid) + suffix


def _tensors(hf_model, arch: str) -> dict[str, torch.Tensor]:
    c = hf_model.config
    name_map = gguf.get_tensor_name_map(ARCH_OF[arch], c.num_hidden_layers)
    out: dict[str, torch.Tensor] = {}
    for name, w in hf_model.state_dict().items():
        w = w.detach().float().clone()
        bid = int(name.split(".")[2]) if ".layers." in name else -1
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = _permute(w, c.num_attention_heads)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = _permute(w, c.num_key_value_heads)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            w = w + 1.0
        if name.endswith("experts.gate_up_proj") and arch != "gpt-oss":   # [E, 2I, D], gate first
            I = w.shape[1] // 2
            out[_raw(T.FFN_GATE_EXP, bid)], out[_raw(T.FFN_UP_EXP, bid)] = w[:, :I], w[:, I:]
            continue
        if name.endswith("experts.down_proj") and arch != "gpt-oss":
            out[_raw(T.FFN_DOWN_EXP, bid)] = w
            continue
        if arch == "gpt-oss" and ".experts." in name:  # GptOssModel.modify_tensors
            if name.endswith("gate_up_proj"):
                w = w.transpose(-1, -2)
                out[_raw(T.FFN_GATE_EXP, bid)], out[_raw(T.FFN_UP_EXP, bid)] = w[:, ::2], w[:, 1::2]
            elif name.endswith("gate_up_proj_bias"):
                out[_raw(T.FFN_GATE_EXP, bid, ".bias")], out[_raw(T.FFN_UP_EXP, bid, ".bias")] = w[..., ::2], w[..., 1::2]
            elif name.endswith("down_proj"):
                out[_raw(T.FFN_DOWN_EXP, bid)] = w.transpose(-1, -2)
            else:
                out[_raw(T.FFN_DOWN_EXP, bid, ".bias")] = w
            continue
        if name.endswith("self_attn.sinks"):
            out[_raw(T.ATTN_SINKS, bid)] = w
            continue
        if name.endswith("shared_expert_gate.weight"):
            w = w.reshape(-1)
        if name.endswith(("conv.conv.weight", "conv1d.weight")):
            w = w.squeeze(1)
        if name.endswith("A_log"):
            out[_raw(T.SSM_A, bid, "")] = -torch.exp(w)
            continue
        if name.endswith("mixer.D"):
            out[_raw(T.SSM_D, bid, "")] = w
            continue
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        gname = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise ValueError(f"gguf-py maps no {arch} name onto {name!r}")
        out[gname] = w
    if arch == "llama" and (f := _rope_freqs(c)) is not None:
        out[TENSOR_NAMES[T.ROPE_FREQS] + ".weight"] = f
    return out


def _meta(hf_model, arch: str) -> dict:
    c = hf_model.config
    D = c.hidden_size
    m = {"block_count": c.num_hidden_layers, "embedding_length": D, "vocab_size": c.vocab_size,
         "context_length": 1048576 if arch == "mamba" else c.max_position_embeddings}
    if arch == "mamba":
        m.update({"ssm.conv_kernel": c.conv_kernel, "ssm.inner_size": c.intermediate_size,
                  "ssm.state_size": c.state_size, "ssm.time_step_rank": c.time_step_rank,
                  "attention.layer_norm_rms_epsilon": c.layer_norm_epsilon})
        return m
    H = c.num_attention_heads
    head_dim = D // H if arch in ("qwen2", "qwen2moe", "lfm2") else c.head_dim
    m.update({"attention.head_count": H, "attention.head_count_kv": c.num_key_value_heads,
              "attention.layer_norm_rms_epsilon": c.norm_eps if arch == "lfm2" else c.rms_norm_eps, "rope.freq_base": float(c.rope_parameters["rope_theta"]
                                                                                           if arch != "gemma3" else
                                                                                           c.rope_parameters["full_attention"]["rope_theta"]),
              "attention.key_length": head_dim, "attention.value_length": head_dim,
              "feed_forward_length": c.intermediate_size})
    if arch == "llama":
        m["rope.dimension_count"] = head_dim
    if arch in ("qwen2moe", "qwen3moe"):
        m.update({"expert_count": c.num_experts, "expert_used_count": c.num_experts_per_tok,
                  "expert_feed_forward_length": c.moe_intermediate_size})
        if arch == "qwen2moe":
            m["expert_shared_feed_forward_length"] = c.shared_expert_intermediate_size
    if arch.startswith("gemma"):
        m["attention.sliding_window"] = c.sliding_window
        if c.final_logit_softcapping is not None:
            m["final_logit_softcapping"] = float(c.final_logit_softcapping)
        if arch == "gemma2":
            m["attn_logit_softcapping"] = float(c.attn_logit_softcapping)
    if arch == "lfm2":
        m["attention.head_count_kv"] = [c.num_key_value_heads if t == "full_attention" else 0 for t in c.layer_types]
        m["shortconv.l_cache"] = c.conv_L_cache
        m["feed_forward_length"] = hf_model.model.layers[0].feed_forward.w1.out_features
    if arch == "gpt-oss":
        m.update({"expert_count": c.num_local_experts, "expert_used_count": c.num_experts_per_tok,
                  "expert_feed_forward_length": c.intermediate_size, "attention.sliding_window": c.sliding_window})
    return m


def _put(w: gguf.GGUFWriter, key: str, v) -> None:
    if isinstance(v, list):
        w.add_array(key, v)
    elif isinstance(v, bool):
        w.add_bool(key, v)
    elif isinstance(v, int):
        w.add_uint32(key, v)
    elif isinstance(v, float):
        w.add_float32(key, v)
    else:
        w.add_string(key, v)


def write_gguf(hf_model, arch: str, path, *, qtype: gguf.GGMLQuantizationType | None = None,
               split_max_tensors: int = 0, drop: tuple[str, ...] = ()) -> None:
    """Write ``hf_model`` as a GGUF of ``arch``; ``qtype`` quantizes the 2-D weights whose rows fit its blocks."""
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[ARCH_OF[arch]], split_max_tensors=split_max_tensors)
    w.add_name(f"tiny {arch}")
    w.add_token_list([f"<t{i}>" for i in range(hf_model.config.vocab_size)])
    for k, v in _meta(hf_model, arch).items():
        _put(w, f"{gguf.MODEL_ARCH_NAMES[ARCH_OF[arch]]}.{k}", v)
    for name, t in _tensors(hf_model, arch).items():
        if name in drop:
            continue
        a = t.numpy().astype(np.float32)
        block = gguf.GGML_QUANT_SIZES[qtype][0] if qtype is not None else 0
        if qtype is not None and a.ndim == 2 and a.shape[-1] % block == 0 and name != "token_embd.weight":
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
