"""The softmax stores take their kernel once, at construction (``kernel`` of the config): the
fused form and the reference form agree, prefill and chunked, with and without autograd."""

import pytest
import torch

from storelab.stores import observe
from storelab.ops.attention import KERNELS
from storelab.stores.attention import AttentionConfig, WindowConfig
from storelab.stores.msa import MsaConfig
from tests.helpers import assert_close

D = 32
ATTN = dict(d_model=D, n_heads=4, n_kv_heads=2, head_dim=8, partial_rotary=0.5, rope_theta=100.0)


def _pair(make, **kw):
    """The same store built with each kernel, the same weights."""
    torch.manual_seed(0)
    fused = make(**ATTN, **kw).build()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in fused.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    ref = make(**ATTN, **kw, kernel="reference").build()
    ref.load_state_dict(fused.state_dict())
    return fused, ref


def _chunked(mod, x, cuts):
    st, ys = None, []
    for a, b in zip((0, *cuts), (*cuts, x.shape[1])):
        y, st = mod(x[:, a:b], st)
        ys.append(y)
    return torch.cat(ys, dim=1)


CASES = [(AttentionConfig, {}), (AttentionConfig, dict(sink=True, gate=True)), (AttentionConfig, dict(v_head_dim=12)),
         (WindowConfig, dict(window=5, sink=True)), (MsaConfig, dict(block_size=4, top_blocks=3, index_head_dim=8)),
         (MsaConfig, dict(block_size=4, top_blocks=4, local_blocks=2, include_first_block=True, index_head_dim=8))]


@pytest.mark.parametrize("make,kw", CASES)
def test_fused_and_reference_kernels_agree(make, kw):
    fused, ref = _pair(make, **kw)
    assert fused.kernel is KERNELS["fused"] and ref.kernel is KERNELS["reference"]
    x = torch.randn(2, 21, D)
    with torch.no_grad(), observe(fused, ref) as seen:
        want = ref(x)[0]
        assert_close(fused(x)[0], want, 1e-5, f"{make.__name__} prefill")
        assert_close(_chunked(fused, x, (1, 8, 9)), want, 1e-5, f"{make.__name__} chunked fused")
        assert_close(_chunked(ref, x, (4, 5, 17)), want, 1e-5, f"{make.__name__} chunked reference")
    if make is MsaConfig:
        with torch.no_grad(), observe(fused, ref) as seen:
            fused(x), ref(x)
        assert torch.equal(seen.last(fused, "blocks").sort(-1).values, seen.last(ref, "blocks").sort(-1).values)
        assert torch.equal(seen.last(fused, "read_counts"), seen.last(ref, "read_counts"))


@pytest.mark.parametrize("make,kw", CASES[:4])
def test_gradients_agree(make, kw):
    fused, ref = _pair(make, **kw)
    x = torch.randn(1, 13, D)
    grads = []
    for m in (fused, ref):
        xi = x.clone().requires_grad_(True)
        m(xi)[0].square().sum().backward()
        grads.append((xi.grad, [p.grad for p in m.parameters()]))
    assert_close(grads[0][0], grads[1][0], 1e-4, "input gradient")
    for a, b in zip(grads[0][1], grads[1][1]):
        assert_close(a, b, 1e-4, "parameter gradient")


def test_unknown_kernel_is_named():
    with pytest.raises(ValueError, match="kernel"):
        AttentionConfig(**ATTN, kernel="flash3")
    with pytest.raises(ValueError, match="kernel"):
        MsaConfig(**ATTN, kernel="")
