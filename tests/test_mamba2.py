"""Mamba-2 / SSD (arXiv 2405.21060): the chunked op against the per-token reference, the store's state
protocol and accounting, and transformers' Mamba2Mixer and NemotronHMamba2Mixer on the same weights.

* ``ssd`` chunked vs recurrent, fp32: lengths 1, 7, 64, 65, 130 around chunks of 16 and 64; strong, typical
  and weak decays (dt A from about -20 to -1e-3 per token); with an initial state; outputs, final states and
  the gradients of x, dt, A, B, C, D and the initial state, a gradient arriving on the final state too;
  bf16 inputs with fp32 states; the chunks in groups of 1 and 3 (float64, 1e-10);
* the store: chunked prefill then token steps equal one pass, and the chunked store equals the recurrent
  one in value and in every parameter's gradient; ``footprint`` and ``memory_terms`` equal the state's
  measured bytes; ``num_params`` the module's; configs refused with the field named;
* the oracles (fp32, 1e-5): outputs of the mixers of tiny transformers models, ``mamba2``, ``nemotron_h``
  (its dt clamp at time_step_min taking effect), ``bamba`` (with biases), ``granitemoehybrid`` and
  ``zamba2``, each built whole; our final state against the cache's ``ssm_state`` / ``conv_state`` after a
  prefill, and one decoding step after it where the family's step agrees (it does not clamp dt);
* a hybrid model of mamba2 layers: prefill then decoding equal to one pass, bytes, gradients, save / load;
  ``storelab bench mamba2 --quick`` runs and its gradients agree with transformers'.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from storelab.ops import ssd
from storelab.state import tensor_bytes
from storelab.stores import REGISTRY, build_store
from tests.helpers import assert_close, capture, tiny_hf_model

b, H, P, G, N = 2, 4, 3, 2, 5


def _inputs(T, *, dt_scale, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = {"x": torch.randn(b, T, H, P, generator=g),
         "dt": F.softplus(torch.randn(b, T, H, generator=g) - 1) * dt_scale,
         "A": -(0.5 + torch.rand(H, generator=g) * 4),
         "B": torch.randn(b, T, G, N, generator=g), "C": torch.randn(b, T, G, N, generator=g),
         "D": torch.randn(H, generator=g), "S0": torch.randn(b, H, P, N, generator=g)}
    return {n: t.to(dtype).requires_grad_() for n, t in x.items()}


def _run(x, mode, chunk_size=16, with_state=True):
    return ssd(x["x"], x["dt"], x["A"], x["B"], x["C"], D=x["D"], initial_state=x["S0"] if with_state else None,
               output_final_state=True, chunk_size=chunk_size, mode=mode)


def _grads(x, y, S):
    g = torch.Generator().manual_seed(7)
    dy, dS = torch.randn(y.shape, generator=g), torch.randn(S.shape, generator=g)
    loss = (y * dy).sum() + (S * dS).sum()            # a gradient on the outputs and on the final state
    return dict(zip(x, torch.autograd.grad(loss, list(x.values()), allow_unused=True)))


@pytest.mark.parametrize("T", [1, 7, 64, 65, 130])
@pytest.mark.parametrize("dt_scale", [5.0, 1.0, 1e-3])   # strong, typical and weak decays
def test_chunk_equals_recurrent_in_value_and_gradient(T, dt_scale):
    for chunk_size, with_state in ((16, True), (64, False)):
        x = _inputs(T, dt_scale=dt_scale, seed=T)
        y_r, S_r = _run(x, "recurrent", with_state=with_state)
        y_c, S_c = _run(x, "chunk", chunk_size, with_state)
        what = f"T={T} dt_scale={dt_scale} chunk={chunk_size}"
        assert_close(y_c, y_r, 2e-5 * max(1.0, y_r.abs().max().item()), f"y, {what}")
        assert_close(S_c, S_r, 2e-5 * max(1.0, S_r.abs().max().item()), f"final state, {what}")
        g_r, g_c = _grads(x, y_r, S_r), _grads(x, y_c, S_c)
        for name, want in g_r.items():
            if want is None:                               # S0 without an initial state
                assert g_c[name] is None, name
                continue
            assert_close(g_c[name], want, 5e-5 * max(1.0, want.abs().max().item()), f"d{name}, {what}")


@pytest.mark.parametrize("T, dt_scale", [(7, 1.0), (65, 5.0), (130, 1e-3), (1000, 1.0)])
def test_hand_backward_equals_the_reference_in_float64(T, dt_scale):
    """The chunked form's backward is written by hand (``_ChunkedSSD``): float64 against autograd through
    the per-token loop, to 1e-10 relative to the largest value; every third token has dt = 0 (nothing
    written, nothing forgotten)."""
    x = _inputs(T, dt_scale=dt_scale, seed=T, dtype=torch.float64)
    with torch.no_grad():
        x["dt"][:, ::3] = 0.0
    y_r, S_r = _run(x, "recurrent")
    y_c, S_c = _run(x, "chunk")
    assert_close(y_c, y_r, 1e-10 * y_r.abs().max().item(), "y, float64")
    g_r, g_c = _grads(x, y_r, S_r), _grads(x, y_c, S_c)
    for name, want in g_r.items():
        assert_close(g_c[name], want, 1e-10 * max(1.0, want.abs().max().item()), f"d{name}, float64")


@pytest.mark.parametrize("chunks_per_group", [1, 3])
def test_chunks_in_groups_equal_the_reference_in_float64(monkeypatch, chunks_per_group):
    """The chunked form goes through its chunks in cache-sized groups (``GROUP_FLOATS``), which the small
    shapes here fit in one: with groups of 1 and 3 chunks (7 chunks, the last group short) the values and
    gradients are still the per-token loop's, float64 to 1e-10."""
    ssd_module = importlib.import_module("storelab.ops.ssd")   # the package's ``ssd`` is the function
    monkeypatch.setattr(ssd_module, "GROUP_FLOATS", chunks_per_group * b * H * 16 * 16)
    x = _inputs(100, dt_scale=1.0, seed=5, dtype=torch.float64)
    y_r, S_r = _run(x, "recurrent")
    y_c, S_c = _run(x, "chunk", chunk_size=16)
    assert_close(y_c, y_r, 1e-10 * y_r.abs().max().item(), "y, grouped chunks")
    assert_close(S_c, S_r, 1e-10 * S_r.abs().max().item(), "final state, grouped chunks")
    g_r, g_c = _grads(x, y_r, S_r), _grads(x, y_c, S_c)
    for name, want in g_r.items():
        assert_close(g_c[name], want, 1e-10 * max(1.0, want.abs().max().item()), f"d{name}, grouped chunks")


def test_chunked_op_passes_gradcheck():
    x = _inputs(11, dt_scale=1.0, seed=3, dtype=torch.float64)
    names = list(x)

    def fn(*ts):
        y, S = _run(dict(zip(names, ts)), "chunk", chunk_size=4)
        return y, S
    assert torch.autograd.gradcheck(fn, tuple(x.values()), eps=1e-6, atol=1e-6, rtol=1e-4, fast_mode=True)


def test_decays_span_strong_to_weak():
    """The cases above reach both ends: per-token decays near zero and near one."""
    strong, weak = (_inputs(130, dt_scale=s, seed=130) for s in (5.0, 1e-3))
    assert (strong["dt"] * strong["A"]).min() < -10 and (weak["dt"] * weak["A"]).max() > -1e-3


def test_bf16_inputs_keep_fp32_states():
    x = _inputs(70, dt_scale=1.0, dtype=torch.bfloat16)
    y, S = _run(x, "chunk")
    assert y.dtype == S.dtype == torch.float32
    x32 = {n: t.detach().float() for n, t in x.items()}     # the same bf16 numbers, widened
    y_r, S_r = _run(x32, "recurrent")
    assert_close(y, y_r, 2e-5 * y_r.abs().max().item(), "bf16 inputs, y")
    assert_close(S, S_r, 2e-5 * S_r.abs().max().item(), "bf16 inputs, final state")


def test_op_refuses_bad_shapes_by_name():
    x = _inputs(5, dt_scale=1.0)
    with pytest.raises(ValueError, match="dt"):
        ssd(x["x"], x["dt"][..., :2], x["A"], x["B"], x["C"])
    with pytest.raises(ValueError, match="groups do not divide"):
        ssd(x["x"], x["dt"], x["A"], x["B"][:, :, :1].expand(b, 5, 3, N), x["C"][:, :, :1].expand(b, 5, 3, N))
    with pytest.raises(ValueError, match="mode"):
        ssd(x["x"], x["dt"], x["A"], x["B"], x["C"], mode="scan")


# ---------------------------------------------------------------------------- the store
STORE = dict(kind="mamba2", d_model=16, n_heads=4, head_dim=4, d_state=6, n_groups=2, chunk_size=8)


def _store(**over):
    torch.manual_seed(0)
    m = build_store({**STORE, **over}).build()
    with torch.no_grad():                                   # move the zero / one initialisations
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("over", [{}, dict(norm="full", use_bias=True), dict(norm="none", use_conv_bias=False),
                                  dict(norm_before_gate=True, dt_limit=(0.01, 0.5))])
def test_prefill_then_steps_equals_one_pass(over):
    m = _store(**over).eval()
    x = torch.randn(2, 29, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, st_want = m(x)
        y1, st = m(x[:, :19])                                # a chunked prefill (two chunks and a part) ...
        ys = [y1]
        for t in range(19, 29):                             # ... then token steps
            y, st = m(x[:, t:t + 1], st)
            ys.append(y)
    assert_close(torch.cat(ys, 1), want, 1e-5, f"prefill + steps vs one pass, {over}")
    assert_close(st.S, st_want.S, 1e-5, "state")
    assert_close(st.conv, st_want.conv, 1e-6, "conv tail")
    assert st.seen == 29 and st.entries == 4


def test_chunked_store_equals_recurrent_store_with_gradients():
    x = torch.randn(2, 21, 16, generator=torch.Generator().manual_seed(2), requires_grad=True)
    out = {}
    for mode in ("chunk", "recurrent"):
        m = _store(mode=mode)
        y, st = m(x)
        loss = y.square().sum() + st.S.sum()
        grads = torch.autograd.grad(loss, [x, *m.parameters()])
        out[mode] = (y, dict(zip(["x", *(n for n, _ in m.named_parameters())], grads)))
    assert_close(out["chunk"][0], out["recurrent"][0], 1e-5, "chunk vs recurrent store")
    for name, g in out["recurrent"][1].items():
        assert g.abs().sum() > 0, name
        assert_close(out["chunk"][1][name], g, 1e-4 * max(1.0, g.abs().max().item()), f"d{name}")


@pytest.mark.parametrize("dtype, fmt", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_footprint_is_the_measured_state(dtype, fmt):
    cfg = build_store({**STORE, "conv_kernel": 3})
    m = cfg.build().to(dtype)
    _, st = m(torch.randn(3, 11, 16).to(dtype))
    assert st.S.dtype == torch.float32 and st.S.shape == (3, 4, 4, 6)
    per_seq = st.nbytes() // 3
    assert per_seq == tensor_bytes(st.S, st.conv) // 3
    for L in (11, 1000):
        fp = cfg.footprint(L, dtype=fmt)
        assert fp.state_bytes == per_seq and fp.kept == fp.read == 4
    assert cfg.footprint(11).read_flops == 2 * 4 * 4 * 6
    terms = cfg.memory_terms(state="fp32")
    assert terms.per_token == 0 and terms.per_sequence == (4 * 4 * 6 + 2 * cfg.conv_channels) * 4
    if dtype == torch.float32:
        assert terms.per_sequence == per_seq


@pytest.mark.parametrize("over", [{}, dict(use_bias=True), dict(norm="none", use_conv_bias=False)])
def test_num_params_counts_the_module(over):
    cfg = build_store({**STORE, **over})
    assert cfg.num_params().stored == sum(p.numel() for p in cfg.build().parameters())


def test_parameter_names_are_the_documented_ones():
    names = {n for n, _ in build_store({**STORE, "use_bias": True}).build().named_parameters()}
    assert names == {"in_proj.weight", "in_proj.bias", "conv_weight", "conv_bias", "dt_bias", "A_log", "D",
                     "norm_weight", "out_proj.weight", "out_proj.bias"}


@pytest.mark.parametrize("field, value", [("n_groups", 3), ("head_dim", 0), ("dt_limit", (0.5, 0.1)),
                                          ("dt_limit", (0.1,)), ("dt_limit", (math.nan, 1.0)), ("dt_limit", ("0", 1)),
                                          ("norm", "layer"), ("mode", "scan"), ("use_bias", 1), ("dt_max", 1e-4)])
def test_bad_configs_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        build_store({**STORE, field: value})


def test_kind_is_registered_with_its_declarations():
    cls = REGISTRY["mamba2"]
    assert cls.RECURRENT and cls.SLOTS == ("token",) and cls.FAMILY == "recurrent"
    assert "2405.21060" in cls.CARD.source


def test_log_decay_is_dt_times_A():
    m = _store(dt_limit=(0.02, 2.0))
    x = torch.randn(2, 5, 16)
    dt = F.softplus(m.in_proj(x)[..., -4:] + m.dt_bias).clamp(0.02, 2.0)
    assert_close(m._log_decay(x), dt * -m.A_log.exp(), 1e-6, "log decay")
    assert (m._log_decay(x) < 0).all()


# ---------------------------------------------------------------------------- transformers' mixers
def _unit_scale_(hf, seed=1):
    """Matrices ~ N(0, 1/fan_in); the norm's gain 1 + N(0, 0.1^2); dt_bias ~ N(-2, 1) (steps around 0.1,
    some below a clamp of 0.05), A in [1, 8], D and the conv bias random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name == "conv1d.weight":
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
            elif name == "norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name == "dt_bias":
                p.copy_(torch.randn(p.shape, generator=g) - 2.0)
            elif name == "A_log":
                p.copy_(torch.empty(p.shape).uniform_(1, 8, generator=g).log())
            else:                                           # D, conv1d.bias
                p.copy_(torch.randn(p.shape, generator=g))


def _ours_from(hf, *, d_model, chunk_size):
    """Our store with the mixer's weights and settings, through the module docstring's table."""
    cfg = build_store(dict(kind="mamba2", d_model=d_model, n_heads=hf.num_heads, head_dim=hf.head_dim,
                           d_state=hf.ssm_state_size, n_groups=hf.n_groups, conv_kernel=hf.conv_kernel_size,
                           chunk_size=chunk_size, norm_eps=hf.norm.variance_epsilon,
                           use_conv_bias=hf.conv1d.bias is not None, use_bias=hf.in_proj.bias is not None,
                           dt_limit=tuple(hf.time_step_limit)))
    ours = cfg.build()
    table = {"in_proj.weight": hf.in_proj.weight, "in_proj.bias": hf.in_proj.bias,
             "conv_weight": hf.conv1d.weight.squeeze(1), "conv_bias": hf.conv1d.bias, "dt_bias": hf.dt_bias,
             "A_log": hf.A_log, "D": hf.D, "norm_weight": hf.norm.weight, "out_proj.weight": hf.out_proj.weight,
             "out_proj.bias": hf.out_proj.bias}
    ours.load_state_dict({k: v for k, v in table.items() if v is not None})   # strict: every one of ours filled
    return ours


def _mixer_input(model, hf, *inputs, **kwargs):
    """The hidden states the mixer is called with inside the whole model, and its output."""
    args, kw, out = capture(model, hf, *inputs, **kwargs)
    return (args[0] if args else kw["hidden_states"]), out


def _check_against(model, hf, ours, ids, next_ids, what, cache_name="past_key_values"):
    x, want = _mixer_input(model, hf, ids)
    with torch.no_grad():
        y, st = ours(x)
    assert want.abs().max() > 0.1
    assert_close(y, want, 1e-5, f"{what}: output vs transformers")
    # the state after a prefill, against the cache transformers keeps
    with torch.no_grad():
        out = model(ids, use_cache=True)
    cache = getattr(out, cache_name)                        # (Mamba2 names its cache cache_params)
    assert_close(st.S, cache.get_recurrent_state(0), 1e-5, f"{what}: state vs ssm_state")
    assert_close(st.conv, cache.get_conv_state(0)[:, :, 1:].transpose(1, 2), 1e-6, f"{what}: tail vs conv_state")
    if next_ids is None:
        return
    # one decoding step after the prefill, from the cache
    x, want = _mixer_input(model, hf, next_ids, **{cache_name: cache}, use_cache=True)
    with torch.no_grad():
        y, _ = ours(x, st)
    assert_close(y, want, 1e-5, f"{what}: a decoding step vs transformers")


def test_store_matches_transformers_mamba2_mixer():
    model = tiny_hf_model("mamba2", hidden_size=32, num_hidden_layers=2, num_heads=8, head_dim=8, expand=2,
                          state_size=16, n_groups=2, chunk_size=16, vocab_size=64, conv_kernel=4)
    hf = model.backbone.layers[0].mixer
    assert type(hf).__name__ == "Mamba2Mixer"
    _unit_scale_(hf)
    ours = _ours_from(hf, d_model=32, chunk_size=8)
    ids = torch.randint(0, 64, (2, 37), generator=torch.Generator().manual_seed(0))
    _check_against(model, hf, ours, ids, ids[:, :1], "mamba2", cache_name="cache_params")


def test_store_matches_nemotron_h_mamba2_mixer():
    model = tiny_hf_model("nemotron_h", hidden_size=32, layers_block_type=["linear_attention", "full_attention"],
                          mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=2, conv_kernel=3, chunk_size=16,
                          intermediate_size=48, vocab_size=64, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=16, time_step_min=0.05)
    hf = model.model.layers[0].mixer
    assert type(hf).__name__ == "NemotronHMamba2Mixer"
    _unit_scale_(hf, seed=2)
    assert hf.time_step_limit == (0.05, math.inf)
    ours = _ours_from(hf, d_model=32, chunk_size=16)
    ids = torch.randint(0, 64, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():                                   # the clamp takes effect on some tokens
        x = _mixer_input(model, hf, ids)[0]
        raw = F.softplus(hf.in_proj(x)[..., -4:] + hf.dt_bias)
    assert (raw < 0.05).any() and (raw > 0.05).any()
    # no decoding step here: transformers' one-token step does not clamp dt (ours does, as its prefill does)
    _check_against(model, hf, ours, ids, None, "nemotron_h")


SIBLINGS = {  # the same mixer in other families: settings, the mixer's class; layer 0 is the mixer's
    "bamba": (dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=2,
                   mamba_d_conv=3, mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=True),
              "BambaMixer"),
    "granitemoehybrid": (dict(layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16,
                              mamba_d_state=8, mamba_n_groups=1, mamba_d_conv=4, mamba_chunk_size=16,
                              num_local_experts=0), "GraniteMoeHybridMambaLayer"),
    "zamba2": (dict(layers_block_type=["mamba", "hybrid"], n_mamba_heads=8, mamba_headdim=8, mamba_d_state=8,
                    mamba_ngroups=2, mamba_d_conv=3, chunk_size=16, time_step_min=0.05), "Zamba2MambaMixer"),
}


@pytest.mark.parametrize("family", sorted(SIBLINGS))
def test_store_matches_the_mamba2_mixers_of_other_families(family):
    settings, cls = SIBLINGS[family]
    model = tiny_hf_model(family, hidden_size=32, num_hidden_layers=2, intermediate_size=48, vocab_size=64,
                          num_attention_heads=2, num_key_value_heads=2, **settings)
    hf = model.model.layers[0].mamba
    assert type(hf).__name__ == cls
    _unit_scale_(hf, seed=3)
    ours = _ours_from(hf, d_model=32, chunk_size=8)
    ids = torch.randint(0, 64, (2, 29), generator=torch.Generator().manual_seed(2))
    clamped = hf.time_step_limit[0] > 0                     # (their one-token step does not clamp dt)
    _check_against(model, hf, ours, ids, None if clamped else ids[:, :1], family)


def test_bench_mamba2_quick_runs_and_agrees_with_transformers():
    """``storelab bench mamba2 --quick`` (tiny sizes, a smoke check): both rows timed, the gradients agree."""
    import json

    from typer.testing import CliRunner

    from storelab.cli import app

    r = CliRunner().invoke(app, ["bench", "mamba2", "--quick", "--repeats", "1", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["mamba2"]
    assert set(rows) == {"op", "mixer"}
    for name, row in rows.items():
        assert row["peer_ms"] > 0 and row["ours_ms"] > 0 and row["flops"] > 0, name
        assert row["grad_max_abs_diff"] < 1e-3, f"{name}: gradients off transformers' by {row['grad_max_abs_diff']}"
    t = CliRunner().invoke(app, ["bench", "mamba2", "--quick", "--repeats", "1"])
    assert t.exit_code == 0 and "mamba2: forward + backward" in t.output and "mixer" in t.output, t.output


def test_a_hybrid_model_of_mamba2_layers_decodes_trains_and_reloads(tmp_path):
    """Three Mamba-2 layers to one attention layer, from a model table: chunked prefill then decoding equals
    one pass, the cache's bytes are the accounting's, every parameter gets a gradient, save and load."""
    from storelab.checkpoint import load, save
    from storelab.models.config import ModelConfig
    from storelab.models.model import Model, prefill

    cfg = ModelConfig.from_dict({"name": "mamba2-hybrid", "d_model": 32, "vocab_size": 64, "n_layers": 4, "stores": {
        "M": {"kind": "mamba2", "n_heads": 4, "head_dim": 16, "d_state": 8, "n_groups": 2, "chunk_size": 8,
              "dt_limit": [0.01, math.inf]},                # as a TOML file writes it: a list, inf for no upper limit
        "A": {"kind": "attention", "n_heads": 2, "head_dim": 16},
        "F": {"kind": "ffn", "d_ff": 64}, "R": {"kind": "residual"}},
        "layers": [{"at": "all", "pattern": "MMMA", "token": {"M": "M", "A": "A"}, "channel": "F", "depth": "R"}]})
    assert cfg.mix() == "3 mamba2 + 1 full" and cfg.layers[0].token.dt_limit == (0.01, math.inf)
    torch.manual_seed(0)
    model = Model(cfg).eval()
    ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, _ = model(ids)
        _, cache = prefill(model, ids[:, :21], chunk=8)
        steps = [model(ids[:, t:t + 1], cache)[0] for t in range(21, 30)]
    assert_close(torch.cat(steps, 1), want[:, 21:], 1e-5, "hybrid: prefill + steps vs one pass")
    layer = cfg.layers[0].token
    assert cache[0].token.nbytes() == 2 * layer.footprint(30, dtype="fp32").state_bytes

    model.train()
    logits, _ = model(ids)
    F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing

    save(model.eval(), tmp_path / "m")
    loaded = load(tmp_path / "m")
    assert loaded.cfg.layers[0].token.dt_limit == (0.01, math.inf)
    with torch.no_grad():
        assert_close(loaded(ids)[0], want, 0.0, "saved and loaded")
