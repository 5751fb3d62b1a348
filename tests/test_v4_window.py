"""DeepSeek-V4's window-only layer (``v4_window``, transformers' ``sliding_attention``, compress rate 0).

Against transformers' deepseek_v4 on the same weights: a tiny model whose first and last layers are
window-only, saved with save_pretrained and loaded by ``storelab.load`` (logits of the whole model,
greedy ids, chunked prefill then decode), and the layer alone on the hidden states transformers gave
it. Then the store by itself: prefill-then-step equals one pass, the footprint equals the measured
bytes (as computed and in fp8 entries), the published configs' window-only layers, and the errors.
"""

from __future__ import annotations

import pytest
import torch

from storelab.checkpoint import load
from storelab.models.model import generate
from storelab.state import KVCache
from storelab.stores.v4_window import V4WindowCache, V4WindowConfig
from tests.helpers import assert_close, capture
from tests.test_checkpoint import FAMILIES, PROMPT_LEN, prompt, tiny_hf

LAYERS = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"]
NEW_TOKENS = 8  # greedy tokens compared (past the window of 8 either way: the prompt has 21)
TINY = dict(d_model=16, n_heads=2, head_dim=8, rope_dim=4, q_lora=8, o_groups=2, o_lora=4, window=5)


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny deepseek_v4 with window-only layers 0 and 3 (window 8 < the 21-token prompt)."""
    hf = tiny_hf("deepseek_v4", layer_types=LAYERS)
    folder = tmp_path_factory.mktemp("v4_window")
    hf.save_pretrained(folder)
    return hf, folder


def test_the_tiny_model_has_window_only_layers(saved):
    hf, folder = saved
    assert [lay.self_attn.compressor is None for lay in hf.model.layers] == [True, False, False, True]
    ours = load(folder)
    assert [lay.token.KIND for lay in ours.cfg.layers] == ["v4_window", "csa", "hca", "v4_window"]
    main = hf.config.rope_parameters["main"]["rope_theta"]
    assert ours.cfg.layers[0].token.rope_theta == main != ours.cfg.layers[1].token.rope_theta
    assert FAMILIES["deepseek_v4"]["sliding_window"] == ours.cfg.layers[0].token.window < PROMPT_LEN


def test_whole_model_logits_and_generation_match_transformers(saved):
    hf, folder = saved
    ours = load(folder)
    ids = prompt()
    with torch.no_grad():
        ref, got = hf(ids).logits, ours(ids)[0]
    assert relative(got, ref) < 1e-5, f"logits: relative error {relative(got, ref):.2e}"
    ref_ids = hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[:, PROMPT_LEN:]
    assert generate(ours, ids, NEW_TOKENS)[0].tolist() == ref_ids.tolist()
    assert generate(ours, ids, NEW_TOKENS, chunk=4)[0].tolist() == ref_ids.tolist()


@pytest.mark.parametrize("layer", [0, 3])
def test_the_layer_matches_transformers_on_its_inputs(saved, layer):
    hf, folder = saved
    ours = load(folder)
    ids = prompt()
    args, kwargs, out = capture(hf, hf.model.layers[layer].self_attn, ids)
    x = args[0]  # the layer is called with the hidden states first
    with torch.no_grad():
        y, state = ours.blocks[layer].token(x)
    assert relative(y, out[0]) < 1e-5, f"layer {layer}: relative error {relative(y, out[0]):.2e}"
    assert state.seen == PROMPT_LEN and state.entries == ours.cfg.layers[layer].token.window


def _store(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    m = V4WindowConfig(**{**TINY, **kw}).build().double()
    with torch.no_grad():
        for p in m.parameters():  # norms and sinks start constant: move them so every path counts
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("chunks", [(13,), (3, 1, 1, 8), (1,) * 13, (5, 8)])
def test_prefill_then_step_equals_one_pass(chunks):
    m = _store()
    x = torch.randn(2, sum(chunks), TINY["d_model"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = m(x)
        state, ys, a = None, [], 0
        for c in chunks:
            y, state = m(x[:, a:a + c], state)
            ys.append(y)
            a += c
    assert_close(torch.cat(ys, 1), full, atol=1e-12, what=f"chunks {chunks}")
    assert state.seen == x.shape[1] and state.entries == TINY["window"]


def test_reads_only_the_window_and_its_sinks():
    """Past the window, what came before changes nothing; the sinks take a share of each softmax."""
    m = _store()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 12, TINY["d_model"], dtype=torch.float64, generator=g)
    x2 = x.clone()
    x2[:, :6] = torch.randn(1, 6, TINY["d_model"], dtype=torch.float64, generator=g)
    with torch.no_grad():
        y, y2 = m(x)[0], m(x2)[0]
        assert_close(y2[:, 6 + TINY["window"] - 1:], y[:, 6 + TINY["window"] - 1:], atol=1e-12, what="past the window")
        assert not torch.allclose(y2[:, 6:6 + TINY["window"] - 1], y[:, 6:6 + TINY["window"] - 1])
        m.sinks.fill_(30.0)  # the sink takes the whole softmax: nothing is read
        assert m(x)[0].abs().max() < 1e-9


@pytest.mark.parametrize("fmt", [None, "fp8", "fp4"])
def test_footprint_equals_measured_bytes(fmt):
    cfg = V4WindowConfig(**TINY, cache_format=fmt, quant_block=4)
    m = cfg.build()
    state = None
    for T in (1, 2, 3, 9):   # seen 1, 3, 6, 15: below, across and past the window
        with torch.no_grad():
            _, state = m(torch.randn(1, T, TINY["d_model"]), state)
        fp = cfg.footprint(state.seen, dtype=fmt or "fp32")
        assert state.nbytes() == fp.state_bytes and state.entries == fp.kept == min(state.seen, cfg.window)
    terms = cfg.memory_terms(cache=fmt or "fp32")
    assert terms.per_token == 0 and terms.per_sequence == cfg.window * cfg.cache_entry_bytes(fmt or "fp32")


def test_fp8_entries_read_close_to_the_plain_ones():
    plain, coded = _store().float(), _store(cache_format="fp8", quant_block=4).float()
    x = torch.randn(1, 11, TINY["d_model"], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = plain(x)[0], coded(x)[0]
    assert 0 < relative(b, a) < 0.1


def test_parameters_are_counted_as_built():
    cfg = V4WindowConfig(**TINY)
    assert cfg.num_params().stored == sum(p.numel() for p in cfg.build().parameters())
    # V4-Pro's widths, one entry in fp8: DeepSeek's 584 bytes (shared/reference/models.md)
    assert V4WindowConfig(d_model=7168).cache_entry_bytes("fp8") == 584


@pytest.mark.parametrize("kw,field", [(dict(rope_dim=3), "rope_dim"), (dict(o_groups=3), "o_groups"),
                                      (dict(window=0), "window"), (dict(cache_format="int3"), "cache_format")])
def test_bad_configs_name_the_field(kw, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        V4WindowConfig(**{**TINY, **kw})


def test_a_foreign_state_is_refused():
    m = _store()
    with pytest.raises(ValueError, match="window_kv"):
        m(torch.randn(1, 2, TINY["d_model"], dtype=torch.float64), KVCache())
    assert isinstance(m(torch.randn(1, 2, TINY["d_model"], dtype=torch.float64))[1], V4WindowCache)
