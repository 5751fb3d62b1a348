"""The multimodal wrappers (``storelab/checkpoint/families/wrappers.py``) and the 2026 decoders of transformers 5.23.

Wrappers: for every wrapper whose text model storelab reads, transformers' default config
(``AutoConfig.for_model(<type>).to_dict()``) read from config.json alone gives the parameters of transformers'
language model and LM head built from the same config (on the meta device: no memory); tiny LLaVA (Llama text),
Qwen2.5-VL (M-RoPE text) and Idefics3 (``model.text_model``) models saved with ``save_pretrained`` load and give
transformers' logits on text tokens (fp32, 1e-5 of the scale; chunked prefill and steps equal to one pass); a
wrapper whose text model is not read is refused naming both model types.
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import CheckpointError
from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.families.wrappers import WRAPPERS
from storelab.models.accounting import count_params
from tests.family_harness import check_logits

transformers = pytest.importorskip("transformers")

# transformers' own default configs that it cannot build here: a vision tower from timm (not installed), Aya
# Vision's default SigLIP (1152 wide, 14 heads: refused by torch's attention); PaliGemma's text model attends to
# its prefix both ways (refused by the gemma family, naming use_bidirectional_attention)
# transformers cannot build these wrappers' default configs on the meta device (cohere_compass: its rotary embedding
# looks up rope_parameters["full_attention"], which its default text config does not have)
UNBUILT = {"fast_vlm", "perception_lm", "aya_vision", "cohere_compass"}


def _default(model_type: str) -> dict:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type).to_dict()


def _read(hf: dict, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return read_model_config(tmp_path)


def _reads(model_type: str, tmp_path) -> bool:
    try:
        _read(_default(model_type), tmp_path)
    except CheckpointError:
        return False
    return True


def _auto(model_type: str):
    from transformers import AutoModelForImageTextToText, AutoModelForMultimodalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return AutoModelForImageTextToText if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES \
        else AutoModelForMultimodalLM


def _text_params(model) -> int:
    """Parameters and saved buffers of the language model and its head (a tied matrix once)."""
    saved = set(model.state_dict())
    params = dict(model.named_parameters())
    n = sum(p.numel() for k, p in params.items() if "language_model" in k or "text_model" in k
            or k.startswith("lm_head"))
    return n + sum(b.numel() for k, b in model.named_buffers() if k in saved and k not in params
                   and ("language_model" in k or "text_model" in k) and b.dtype.is_floating_point)


@pytest.mark.parametrize("model_type", sorted(set(WRAPPERS) - UNBUILT))
def test_text_parameters_equal_transformers(model_type, tmp_path):
    """The text model of the default config: ours from config.json alone equal transformers' language model."""
    from transformers import AutoConfig

    if not _reads(model_type, tmp_path):
        pytest.skip(f"{model_type}: its text model is refused (test_refused_names_both)")
    cfg = _read(_default(model_type), tmp_path)
    with torch.device("meta"):
        model = _auto(model_type).from_config(AutoConfig.for_model(model_type))
    assert count_params(cfg).stored == _text_params(model)
    assert "not built" in cfg.notes


@pytest.mark.parametrize("model_type", ["llava", "qwen2_5_vl", "mistral3", "internvl", "smolvlm", "voxtral"])
def test_published_wrappers_read(model_type, tmp_path):
    """A few wrappers the brief names: read, with the tower named in the notes."""
    cfg = _read(_default(model_type), tmp_path)
    assert cfg.n_layers > 0 and count_params(cfg).stored > 0


def test_refused_names_both(tmp_path):
    hf = _default("glm4v")
    with pytest.raises(CheckpointError, match=r"'glm4v' wraps the text model 'glm4v_text', which is not read"):
        _read(hf, tmp_path)
    hf = _default("blip-2")
    with pytest.raises(CheckpointError, match=r"'blip-2' wraps the text model 'opt'.*absolute position"):
        _read(hf, tmp_path)


def test_text_model_of_another_family(tmp_path):
    """A wrapper takes whatever text model its file names (InternVL over Llama, not its default Qwen2); a field
    of it refused names the wrapper's field."""
    hf = _default("internvl")
    hf["text_config"] = dict(_default("llama"), num_hidden_layers=3)
    assert _read(hf, tmp_path).n_layers == 3
    hf["text_config"]["hidden_size"] = "x"
    with pytest.raises(CheckpointError, match=r"text_config\.hidden_size: must be an integer"):
        _read(hf, tmp_path)


def test_tie_is_the_wrappers():
    """transformers ties a wrapper's embeddings by the wrapper's field only: a text config's tie is not read."""
    from storelab.checkpoint.families.wrappers import FAMILY

    hf = _default("qwen2_audio")
    hf["text_config"]["tie_word_embeddings"] = True
    assert not FAMILY.to_config(hf).tie_embeddings
    assert FAMILY.to_config(dict(hf, tie_word_embeddings=True)).tie_embeddings


# -- tiny wrappers against transformers' logits ------------------------------------------------------------
TEXT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
            vocab_size=128, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
CLIP = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, image_size=32, patch_size=16, projection_dim=32)
TINY = {
    "llava": dict(text_config=dict(TEXT, model_type="llama"), vision_config=CLIP, image_token_index=127),
    "qwen2_5_vl": dict(text_config=dict(TEXT, model_type="qwen2_5_vl_text",
                                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                         "mrope_section": [2, 3, 3]}),
                       vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                          out_hidden_size=64, fullatt_block_indexes=[0]),
                       image_token_id=125, video_token_id=126, vision_start_token_id=124),
    "idefics3": dict(text_config=dict(TEXT, model_type="llama"),
                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, image_size=32, patch_size=16),
                     image_token_id=127),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoConfig

    built = {}

    def get(name: str):
        if name not in built:
            torch.manual_seed(0)
            model = _auto(name).from_config(AutoConfig.for_model(name, **TINY[name])).eval()
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for t in model.state_dict().values():
                    if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                        t.add_(0.1 * torch.randn(t.shape, generator=g))
            folder = tmp_path_factory.mktemp(name)
            model.save_pretrained(folder)
            built[name] = (model, folder)
        return built[name]

    return get


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_wrapper_logits(name, tiny):
    model, folder = tiny(name)
    check_logits(model, folder, what=name)
    cfg = read_model_config(folder)
    assert count_params(cfg).stored == _text_params(model)


# -- Mistral Small 4 (storelab/checkpoint/families/mistral4.py) ---------------------------------------------
from tests.family_harness import check_bf16, check_cache, check_counts  # noqa: E402

MISTRAL4 = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
                qk_nope_head_dim=16, v_head_dim=16, routed_scaling_factor=1.5, max_position_embeddings=512,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.0}
NEWCOMERS = {
    # YaRN as the release, without the position temperature (running refuses it); transformers' default rope
    # rotates the whole MLA head, so its configs all name a scaling
    "mistral4": dict(MISTRAL4, rope_parameters=YARN),
    "mistral4_halves": dict(MISTRAL4, rope_parameters=YARN, rope_interleave=False, norm_topk_prob=False),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(transformers model, its folder) per setting; ``Mistral4ForCausalLM`` is in none of the auto mappings."""
    from transformers import Mistral4Config, Mistral4ForCausalLM

    built = {}

    def get(name: str):
        if name not in built:
            torch.manual_seed(0)
            model = Mistral4ForCausalLM(Mistral4Config(**NEWCOMERS[name])).eval()
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for t in model.state_dict().values():
                    if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                        t.add_(0.1 * torch.randn(t.shape, generator=g))
            folder = tmp_path_factory.mktemp(name)
            model.save_pretrained(folder)
            built[name] = (model, folder)
        return built[name]

    return get


@pytest.mark.parametrize("name", list(NEWCOMERS))
def test_newcomer_logits(name, saved):
    check_logits(*saved(name), what=name)


@pytest.mark.parametrize("name", list(NEWCOMERS))
def test_newcomer_bf16(name, saved):
    check_bf16(*saved(name), what=name)


@pytest.mark.parametrize("name", list(NEWCOMERS))
@pytest.mark.parametrize("T", [4, 17])
def test_newcomer_cache(name, T, saved):
    check_cache(*saved(name), T)


@pytest.mark.parametrize("name", list(NEWCOMERS))
def test_newcomer_counts(name, saved):
    check_counts(*saved(name))


def test_mistral4_read_and_refusals(saved, tmp_path):
    """Softmax experts without a choice bias; the position temperature and two-best group scores refused by name."""
    from storelab.checkpoint.families.mistral4 import FAMILY

    hf, folder = saved("mistral4")
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["mla"] * 3
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe"]
    ch = cfg.layers[1].channel
    assert (ch.router, ch.router_bias, ch.routed_scaling, ch.shared_width) == ("softmax", False, 1.5, 32)
    default = _default("mistral4")
    FAMILY.to_config(default)  # accounted
    with pytest.raises(CheckpointError, match="rope_parameters.llama_4_scaling_beta: > 0"):
        FAMILY.runs(default)
    with pytest.raises(CheckpointError, match="n_group: 4 groups"):
        FAMILY.to_config(dict(default, n_group=4, topk_group=2))
