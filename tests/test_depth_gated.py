"""The gated depth stores: Muse Spark's gated residual (``gated_residual``) and Hunyuan V4's hyper-connections
(``hyper_connection``) against plain references (value and gradient), inside a model (prefill then steps
equals one pass), their accounting, and transformers' ``MuseSparkResidualGate`` and ``HYV4HyperConnection``
(with ``HYV4HyperHead``) driven through the depth protocol on the same weights (fp32, max abs diff <= 1e-5)."""

from __future__ import annotations

import pytest
import torch

from storelab.models.config import load_model
from storelab.models.model import Model
from storelab.stores.depth_gated import GatedResidualConfig, HyperConnectionConfig, residual_gate
from tests.helpers import assert_close

D = 8
ATOL = 1e-5


def _perturbed(module, scale: float = 0.3):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))
    return module


def _stack(cfg, n_sub: int = 4):
    mixers = [_perturbed(cfg.build(sublayer=s, n_sublayers=n_sub)).double() for s in range(n_sub)]
    return mixers, _perturbed(cfg.build_head(n_sublayers=n_sub)).double()


def _run(mixers, head, h, maps, read=None, write=None):
    """The protocol over fixed sublayer maps; ``read``/``write`` (plain forms) replace the mixers' own."""
    ds = mixers[0].init(h)
    reads = []
    for m, w in zip(mixers, maps):
        x = m.read(ds) if read is None else read(m, ds)
        reads.append(x)
        y = torch.tanh(x @ w)
        ds = m.write(ds, y) if write is None else write(m, ds, y)
    return reads, head(ds)


# ------------------------------------------------------------------------------ plain references
def plain_gate(g, temperature, eps):
    """Muse Spark's gate where the clamp is idle: beta = sigmoid(g / tau), alpha = sqrt(1 - beta^2)."""
    beta = torch.sigmoid(g / temperature)
    return torch.sqrt(torch.clamp(1 - beta * beta, min=eps)), beta


def plain_hc_coefficients(m, X):
    """a and c of a hyper-connection, stream by stream from the definitions (no shared helper)."""
    B, T, N, _ = X.shape
    flat = X.reshape(B, T, -1)
    r = flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + m.cfg.norm_eps)
    a = [torch.sigmoid((r * m.weight[n]).sum(-1) * m.scale[0] + m.bias[n]) + m.cfg.eps for n in range(N)]
    c = [m.cfg.magnitude * torch.sigmoid((r * m.weight[N + n]).sum(-1) * m.scale[1] + m.bias[N + n]) + m.cfg.eps
         for n in range(N)]
    return a, c


def plain_hc_read(m, ds):
    a, _ = plain_hc_coefficients(m, ds.streams)
    return sum(a[n][..., None] * ds.streams[:, :, n] for n in range(len(a)))


def plain_hc_write(m, ds, y):
    _, c = plain_hc_coefficients(m, ds.streams)
    return type(ds)(streams=torch.stack([ds.streams[:, :, n] + c[n][..., None] * y for n in range(len(c))], 2))


def test_gate_keeps_the_sum_at_unit_scale_and_clamps_alpha():
    g = torch.tensor([-2.0, -0.3, 0.0, 0.4, 1.0, 3.0, 6.0], dtype=torch.float64, requires_grad=True)
    alpha, beta = residual_gate(g, 0.3, 1e-3)
    want_a, want_b = plain_gate(g, 0.3, 1e-3)
    assert_close(alpha, want_a, 1e-7, "alpha")  # the two forms differ only in rounding near the clamp
    assert_close(beta, want_b, 1e-12, "beta")
    idle = alpha.detach() ** 2 > 1e-3
    assert_close((alpha ** 2 + beta ** 2)[idle], torch.ones(int(idle.sum()), dtype=torch.float64), 1e-12, "a^2 + b^2")
    assert not idle[-1] and alpha[-1].item() == pytest.approx(1e-3 ** 0.5)
    ga, gb = torch.autograd.grad((alpha * torch.arange(7.0) + beta).sum(), g), \
        torch.autograd.grad((want_a * torch.arange(7.0) + want_b).sum(), g)
    assert_close(ga[0][idle], gb[0][idle], 1e-6, "gradient where the clamp is idle")


def test_gated_residual_stack_matches_the_plain_form_in_value_and_gradient():
    cfg = GatedResidualConfig(d_model=D)
    mixers, head = _stack(cfg)
    maps = torch.randn(4, D, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) / D ** 0.5
    h = torch.randn(2, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)

    def write(m, ds, y):
        a, b = plain_gate(m.gate, cfg.temperature, cfg.eps)
        return type(ds)(h=a * ds.h + b * y)

    params = [h] + [p for m in mixers for p in m.parameters()]
    outs = [_run(mixers, head, h, maps), _run(mixers, head, h, maps, write=write)]
    (r1, o1), (r2, o2) = outs
    for s, (a, b) in enumerate(zip(r1, r2)):
        assert_close(a, b, 1e-12, f"read {s}")
    assert_close(o1, o2, 1e-12, "head")
    g1, g2 = (torch.autograd.grad(o.sin().sum(), params) for _, o in outs)
    for i, (a, b) in enumerate(zip(g1, g2)):
        assert_close(a, b, 1e-10, f"gradient {i}")


@pytest.mark.parametrize("N", [1, 2, 3])
def test_hyper_connection_stack_matches_the_plain_form_in_value_and_gradient(N):
    cfg = HyperConnectionConfig(d_model=D, n_streams=N, magnitude=1.5)
    mixers, head = _stack(cfg)
    maps = torch.randn(4, D, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) / D ** 0.5
    h = torch.randn(2, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    params = [h] + [p for m in mixers for p in m.parameters()] + list(head.parameters())
    outs = [_run(mixers, head, h, maps), _run(mixers, head, h, maps, read=plain_hc_read, write=plain_hc_write)]
    (r1, o1), (r2, o2) = outs
    for s, (a, b) in enumerate(zip(r1, r2)):
        assert_close(a, b, 1e-12, f"read {s}")
    assert_close(o1, o2, 1e-12, "head")
    g1, g2 = (torch.autograd.grad(o.sin().sum(), params) for _, o in outs)
    for i, (a, b) in enumerate(zip(g1, g2)):
        assert_close(a, b, 1e-10, f"gradient {i}")


def test_hyper_connection_starts_by_averaging_the_streams():
    m = HyperConnectionConfig(d_model=D, n_streams=4).build(sublayer=0, n_sublayers=2)
    ds = m.init(torch.randn(1, 3, D))
    a, c = m.coefficients(ds.streams)
    assert_close(a, torch.full_like(a, 1 / 4 + 1e-6), 1e-3, "pre at the start: sigmoid(-log 3) = 1/4")
    assert bool((c > 0).all() and (c < 2 + 1e-5).all())


# ------------------------------------------------------------------------------ accounting, config
@pytest.mark.parametrize("cfg", [GatedResidualConfig(d_model=D), HyperConnectionConfig(d_model=D, n_streams=3)],
                         ids=["gated_residual", "hyper_connection"])
def test_accounting(cfg):
    n_sub = 4
    mixers = [cfg.build(sublayer=s, n_sublayers=n_sub) for s in range(n_sub)]
    head = cfg.build_head(n_sublayers=n_sub)
    count = sum(p.numel() for m in [*mixers, head] for p in m.parameters())
    assert cfg.num_params(n_sublayers=n_sub).stored == count
    assert cfg.num_params().stored == sum(p.numel() for p in mixers[1].parameters())
    ds = mixers[0].init(torch.randn(1, 1, D))
    for m in mixers:
        ds = m.write(ds, m.read(ds))
        assert ds.nbytes() == cfg.depth_state_bytes(dtype="fp32")
    fp = cfg.footprint(1000)
    assert fp.kept == fp.state_bytes == 0


@pytest.mark.parametrize("kind, field, value", [(GatedResidualConfig, "temperature", 0.0),
                                                (GatedResidualConfig, "eps", 0),
                                                (HyperConnectionConfig, "n_streams", 0),
                                                (HyperConnectionConfig, "magnitude", -1.0),
                                                (HyperConnectionConfig, "eps", -1.0)])
def test_bad_config_names_the_field(kind, field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        kind(d_model=D, **{field: value})


DEPTH_TABLES = {"gated_residual": 'kind = "gated_residual"\ntemperature = 0.5',
                "hyper_connection": 'kind = "hyper_connection"\nn_streams = 3'}


@pytest.mark.parametrize("depth", list(DEPTH_TABLES.values()), ids=list(DEPTH_TABLES))
def test_a_model_with_the_store_decodes_as_it_prefills(tmp_path, depth):
    p = tmp_path / "m.toml"
    p.write_text(f'name = "m"\nd_model = 16\nvocab_size = 32\nn_layers = 2\n\n[stores.A]\nkind = "attention"\n'
                 f'n_heads = 2\nhead_dim = 8\n\n[stores.F]\nkind = "ffn"\nd_ff = 32\n\n[stores.R]\n{depth}\n\n'
                 f'[[layers]]\nat = "all"\ntoken = "A"\nchannel = "F"\ndepth = "R"\n')
    cfg = load_model(p)
    torch.manual_seed(0)
    model = _perturbed(Model(cfg), 0.1).eval()
    ids = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, _ = model(ids)
        got, cache = model(ids[:, :5])
        steps = [got]
        for t in range(5, 9):
            y, cache = model(ids[:, t:t + 1], cache)
            steps.append(y)
    assert_close(torch.cat(steps, 1), want, 1e-5, "prefill then steps")


# ------------------------------------------------------------------------------ the oracles
def record(model, modules: dict, *inputs):
    """Run ``model(*inputs)``; return {name: (args, output)} for each named submodule (first call)."""
    seen, handles = {}, []
    for name, mod in modules.items():
        def hook(_m, args, out, name=name):
            seen.setdefault(name, (args, out))
        handles.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_gated_residual_matches_muse_spark():
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    hf = AutoConfig.for_model("muse_spark_text", vocab_size=64, hidden_size=32, intermediate_size=32,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              moe_intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, moe_hidden_size=16,
                              sliding_window=4, mlp_layer_types=["dense", "sparse"], residual_gate_temperature=0.3,
                              pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = AutoModel.from_config(hf).eval()
    gates = []
    for layer in model.layers:
        gates += [layer.post_attention_residual_gate, layer.post_feedforward_residual_gate]
    with torch.no_grad():
        for g in gates:  # wider than the 0.02 start, and past the clamp on a few channels
            g.gate.copy_(torch.randn_like(g.gate) * 0.5)
            g.gate[:3] = torch.tensor([3.0, -3.0, 6.0])
    seen = record(model, {f"g{s}": g for s, g in enumerate(gates)}, torch.randint(3, 64, (2, 7)))

    n_sub = len(gates)
    cfg = GatedResidualConfig(d_model=hf.hidden_size, temperature=hf.residual_gate_temperature)
    mixers = [cfg.build(sublayer=s, n_sublayers=n_sub) for s in range(n_sub)]
    for m, g in zip(mixers, gates):
        m.gate.data.copy_(g.gate)
    head = cfg.build_head(n_sublayers=n_sub)
    with torch.no_grad():
        ds = mixers[0].init(seen["g0"][0][0])
        for s, m in enumerate(mixers):
            (residual, y), out = seen[f"g{s}"]
            assert_close(m.read(ds), residual, ATOL, f"read of sublayer {s}")
            ds = m.write(ds, y)
            assert_close(ds.h, out, ATOL, f"sum after sublayer {s}")
        assert_close(head(ds), seen[f"g{n_sub - 1}"][1], ATOL, "head")


@pytest.mark.parametrize("N", [2, 3])
def test_hyper_connection_matches_hunyuan_v4(N):
    from tests.helpers import tiny_hf_model

    model = tiny_hf_model("hy_v4", vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                          n_routed_experts=4, num_experts_per_tok=2, q_lora_rank=16, kv_lora_rank=16,
                          qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, index_topk=4, index_head_dim=8,
                          index_n_heads=2, hc_mult=N, hc_magnitude=1.5, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    hf = model.config
    torch.manual_seed(0)
    for name, p in model.named_parameters():  # away from the start, so that every term counts
        if "_hc." in name or "hc_head" in name:
            p.data = torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.05)
    layers = model.model.layers
    mods = {"embed": model.model.embed_tokens, "head": model.model.hc_head}
    for i, layer in enumerate(layers):
        mods |= {f"hc{2 * i}": layer.attn_hc, f"hc{2 * i + 1}": layer.ffn_hc,
                 f"y{2 * i}": layer.self_attn, f"y{2 * i + 1}": layer.mlp}
    seen = record(model, mods, torch.randint(3, 64, (2, 7)))

    n_sub = 2 * len(layers)
    cfg = HyperConnectionConfig(d_model=hf.hidden_size, n_streams=hf.hc_mult, magnitude=hf.hc_magnitude,
                                eps=hf.hc_eps, norm_eps=hf.rms_norm_eps)
    mixers = [cfg.build(sublayer=s, n_sublayers=n_sub) for s in range(n_sub)]
    for s, m in enumerate(mixers):
        hc = layers[s // 2].attn_hc if s % 2 == 0 else layers[s // 2].ffn_hc
        for ours, theirs in ((m.weight, hc.fn), (m.bias, hc.base), (m.scale, hc.scale)):
            assert ours.shape == theirs.shape
            ours.data.copy_(theirs)
    head, hh = cfg.build_head(n_sublayers=n_sub), model.model.hc_head
    for ours, theirs in ((head.weight, hh.hc_fn), (head.bias, hh.hc_base), (head.scale, hh.hc_scale)):
        assert ours.shape == theirs.shape
        ours.data.copy_(theirs)
    with torch.no_grad():
        ds = mixers[0].init(seen["embed"][1])
        for s, m in enumerate(mixers):
            (streams_in,), (post, collapsed) = seen[f"hc{s}"]
            assert_close(ds.streams, streams_in, ATOL, f"streams entering sublayer {s}")
            assert_close(m.coefficients(ds.streams)[1], post, ATOL, f"post of sublayer {s}")
            assert_close(m.read(ds), collapsed, ATOL, f"read of sublayer {s}")
            y = seen[f"y{s}"][1]
            ds = m.write(ds, y[0] if isinstance(y, tuple) else y)
        assert_close(head(ds), seen["head"][1], ATOL, "head")
