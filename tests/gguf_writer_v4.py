"""A test-side transformers -> GGUF writer for DeepSeek-V4 (``deepseek4``), the way llama.cpp's converter writes it
(``conversion/deepseek.py`` ``DeepseekV4Model``: ``set_gguf_parameters``, ``_map_tensor_name_deepseek4``,
``modify_tensors``, ``_write_deepseek4_tid2eid_tensors``), so that ``storelab/checkpoint/gguf/archs_v4.py`` can be
held to transformers' own model.

    write_gguf_v4(folder, path)   # folder: save_pretrained output (config.json + model.safetensors)

The converter reads DeepSeek's release folder: its config.json (``compress_ratios``, ``num_hash_layers``,
``qk_rope_head_dim``, ``compress_rope_theta``, a top-level ``rope_scaling``) and its tensor names (``embed``,
``hc_head_fn``, ``layers.{i}.attn.kv_norm``). transformers saves the same model in its own form, so the folder is
first turned into the release's (``release_config``, ``release_name``), then converted as the converter does.
gguf-py 0.19 lacks the architecture, so the tensor names are ``archs_v4.NAME``'s and gguf-py's. Tensors are f32
(no quantisation: the round trip must be exact), ``tid2eid`` int32 as the converter writes it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.constants import MODEL_TENSOR as T, TENSOR_NAMES
from safetensors.torch import load_file

from storelab.checkpoint.gguf.archs_v4 import KEY, NAME, SQRT_SOFTPLUS
from tests.gguf_writer_hybrid import _put_kv

__all__ = ["write_gguf_v4", "release_config"]

def release_config(c: dict) -> dict:
    """transformers' saved DeepseekV4Config -> the release config.json fields the converter reads."""
    rates = c["compress_rates"]
    mlp = c["mlp_layer_types"]
    n_hash = mlp.count("hash_moe")
    assert mlp[:n_hash] == ["hash_moe"] * n_hash, "hash layers must come first (num_hash_layers)"
    rp = c["rope_parameters"]
    out = dict(c, compress_ratios=[0 if t == "sliding_attention" else rates[t] for t in c["layer_types"]],
               num_hash_layers=n_hash, qk_rope_head_dim=int(c["head_dim"] * c["partial_rotary_factor"]),
               rope_theta=rp["main"]["rope_theta"], compress_rope_theta=rp["compress"]["rope_theta"])
    if rp["compress"].get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in rp["compress"].items()
                               if k not in ("rope_theta", "partial_rotary_factor", "attention_factor")}
    return out


def release_name(name: str) -> str:
    """A transformers-saved name -> DeepSeek's release name (what ``_map_tensor_name_deepseek4`` reads)."""
    name = name.removeprefix("model.").replace("embed_tokens.", "embed.").replace("hc_head.hc_", "hc_head_")
    return re.sub(r"\.attn\.norm\.weight$", ".attn.kv_norm.weight", name)


def _names() -> dict[str, str]:
    """``_map_tensor_name_deepseek4``'s table (release name -> GGUF name; ``{bid}`` per layer)."""
    gn = lambda kind, sfx=".weight": TENSOR_NAMES[kind] + sfx  # noqa: E731
    top = {"embed.weight": gn(T.TOKEN_EMBD), "norm.weight": gn(T.OUTPUT_NORM), "head.weight": gn(T.OUTPUT),
           "hc_head_base": NAME["OUTPUT_HC_BASE"], "hc_head_fn": NAME["OUTPUT_HC_FN"],
           "hc_head_scale": NAME["OUTPUT_HC_SCALE"]}
    layer = {f"hc_{part}_{q}": NAME[f"HC_{part.upper()}_{q.upper()}"]
             for part in ("attn", "ffn") for q in ("fn", "base", "scale")}
    for theirs, pre in (("attn.compressor", "ATTN"), ("attn.indexer.compressor", "INDEXER")):
        layer.update({f"{theirs}.ape": NAME[f"{pre}_COMPRESSOR_APE"],
                      f"{theirs}.wkv.weight": NAME[f"{pre}_COMPRESSOR_KV"],
                      f"{theirs}.wgate.weight": NAME[f"{pre}_COMPRESSOR_GATE"],
                      f"{theirs}.norm.weight": NAME[f"{pre}_COMPRESSOR_NORM"]})
    layer.update({
        "attn.attn_sink": gn(T.ATTN_SINKS), "attn.wq_a.weight": gn(T.ATTN_Q_A), "attn.wq_b.weight": gn(T.ATTN_Q_B),
        "attn.q_norm.weight": gn(T.ATTN_Q_A_NORM), "attn.wkv.weight": NAME["ATTN_KV"],
        "attn.kv_norm.weight": gn(T.ATTN_KV_A_NORM), "attn.wo_a.weight": NAME["ATTN_OUT_A"],
        "attn.wo_b.weight": NAME["ATTN_OUT_B"],
        "attn.indexer.wq_b.weight": gn(T.INDEXER_ATTN_Q_B), "attn.indexer.weights_proj.weight": gn(T.INDEXER_PROJ),
        "attn_norm.weight": gn(T.ATTN_NORM), "ffn_norm.weight": gn(T.FFN_NORM),
        "ffn.shared_experts.w1.weight": gn(T.FFN_GATE_SHEXP), "ffn.shared_experts.w3.weight": gn(T.FFN_UP_SHEXP),
        "ffn.shared_experts.w2.weight": gn(T.FFN_DOWN_SHEXP), "ffn.gate.weight": gn(T.FFN_GATE_INP),
        "ffn.gate.bias": gn(T.FFN_EXP_PROBS_B, ".bias"), "ffn.gate.tid2eid": NAME["FFN_GATE_TID2EID"],
        "ffn.experts.w1.weight": gn(T.FFN_GATE_EXP), "ffn.experts.w3.weight": gn(T.FFN_UP_EXP),
        "ffn.experts.w2.weight": gn(T.FFN_DOWN_EXP)})
    return {**top, **{f"layers.{{bid}}.{k}": v for k, v in layer.items()}}


def _meta(c: dict, n: int) -> dict:
    """``TextModel.set_gguf_parameters`` (the fields a V4 config has) then ``DeepseekV4Model.set_gguf_parameters``."""
    m = {"block_count": n, "context_length": c["max_position_embeddings"], "embedding_length": c["hidden_size"],
         "attention.head_count": c["num_attention_heads"], "attention.head_count_kv": c.get("num_key_value_heads", 1),
         "rope.freq_base": float(c["rope_theta"]), "attention.layer_norm_rms_epsilon": float(c["rms_norm_eps"]),
         "expert_used_count": c["num_experts_per_tok"], "attention.key_length": c["head_dim"],
         "attention.value_length": c["head_dim"], "expert_gating_func": SQRT_SOFTPLUS}
    if (rs := c.get("rope_scaling")) is not None:
        m.update({"rope.scaling.type": "yarn", "rope.scaling.factor": float(rs["factor"]),
                  "rope.scaling.original_context_length": rs["original_max_position_embeddings"]})
        for k, gk in (("beta_fast", "rope.scaling.yarn_beta_fast"), ("beta_slow", "rope.scaling.yarn_beta_slow")):
            if rs.get(k) is not None:
                m[gk] = float(rs[k])
    m.update({"vocab_size": c["vocab_size"], "rope.dimension_count": c["qk_rope_head_dim"],
              "attention.q_lora_rank": c["q_lora_rank"], KEY["o_lora_rank"]: c["o_lora_rank"],
              KEY["o_groups"]: c["o_groups"], KEY["compress_ratios"]: list(c["compress_ratios"]),
              KEY["compress_rope_theta"]: float(c["compress_rope_theta"]),
              "expert_feed_forward_length": c["moe_intermediate_size"], "expert_count": c["n_routed_experts"],
              "expert_shared_count": c["n_shared_experts"],
              "expert_weights_scale": float(c.get("routed_scaling_factor", 1.0)),
              KEY["num_hash_layers"]: min(c["num_hash_layers"], n)})
    if c.get("norm_topk_prob") is not None:
        m["expert_weights_norm"] = bool(c["norm_topk_prob"])
    if c.get("swiglu_limit") is not None and float(c["swiglu_limit"]) > 0.0:
        m["swiglu_clamp_exp"] = [float(c["swiglu_limit"])] * n
    if c.get("sliding_window") is not None:
        m["attention.sliding_window"] = c["sliding_window"]
    m.update({"attention.indexer.head_count": c["index_n_heads"], "attention.indexer.key_length": c["index_head_dim"],
              "attention.indexer.top_k": c["index_topk"]})
    if c.get("num_nextn_predict_layers") is not None:
        m["nextn_predict_layers"] = c["num_nextn_predict_layers"]
    m.update({KEY["hc_mult"]: c["hc_mult"], KEY["hc_sinkhorn_iters"]: c["hc_sinkhorn_iters"],
              KEY["hc_eps"]: float(c["hc_eps"])})
    return m


def convert(c: dict, sd: dict) -> tuple[dict, dict]:
    """(metadata, GGUF tensors) of a release config and its release-named tensors."""
    n = c["num_hidden_layers"]
    table = _names()
    tensors: dict[str, torch.Tensor] = {}
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in sd.items():
        if name.startswith("mtp."):
            continue
        if (e := re.match(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$", name)) is not None:
            experts.setdefault((int(e[1]), e[3]), {})[int(e[2])] = t
            continue
        if name.endswith("tid2eid"):
            t = t.to(torch.int32)
        if (lay := re.match(r"layers\.(\d+)\.(.+)$", name)) is not None:
            tensors[table[f"layers.{{bid}}.{lay[2]}"].format(bid=int(lay[1]))] = t
        else:
            tensors[table[name]] = t
    for (bid, w), per in experts.items():   # stacked [E, ...] per layer, w1, w3, w2
        tensors[table[f"layers.{{bid}}.ffn.experts.{w}.weight"].format(bid=bid)] = torch.stack(
            [per[x] for x in range(c["n_routed_experts"])])
    return _meta(c, n), tensors


def write_gguf_v4(folder: Path, path: Path) -> Path:
    c = release_config(json.loads((Path(folder) / "config.json").read_text()))
    sd = {release_name(k): v for k, v in load_file(str(Path(folder) / "model.safetensors")).items()}
    meta, tensors = convert(c, sd)
    w = gguf.GGUFWriter(path, "deepseek4")
    for k, v in meta.items():
        _put_kv(w, f"deepseek4.{k}", v)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for name, t in tensors.items():
        arr = t.detach().numpy() if t.dtype == torch.int32 else t.detach().to(torch.float32).numpy()
        w.add_tensor(name, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
