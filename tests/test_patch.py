"""storelab.probes.patch: position-aligned swaps, on models whose answer is known by construction.

* ``pattern:WK`` with a window of 1 at layer 0: the window layer's entries at t-1 and t are made
  from the tokens there alone, the same in both prompts, so only the recurrent layer can carry a
  value stored earlier: swapping the recurrent states moves the whole shift, the caches none;
* the same model, one layer at a time: the one recurrent layer has the whole effect;
* swapping every layer at t equals running the spliced sequence (donor to t, base after), exactly;
* a donor equal to the base changes nothing, exactly;
* a swap at t during decoding equals one in a prefill (same t), and greedy decoding with the swap
  picks the argmax of the patched logits.
"""

from __future__ import annotations

import pytest
import torch

from storelab.models.model import Model
from storelab.probes.patch import (Swap, clean_logits, generate, layer_sweep, layers_of, logit_diff, patched_logits,
                                   swap_fraction)
from storelab.train.models import resolve_model
from tests.helpers import assert_close

V = 64
SMALL = dict(d_model=32, n_heads=2, head_dim=16, d_ff=64)


def build(name: str, seed: int = 0, **opts) -> Model:
    torch.manual_seed(seed)
    return Model(resolve_model(name, V, **{**SMALL, **opts})).eval()


def pair(T: int = 14, at: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Base and donor prompts [2, T] that differ only at position ``at`` (the stored value)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, V, (2, T), generator=g)
    donor = base.clone()
    donor[:, at] = (base[:, at] + 1 + torch.randint(V - 1, (2,), generator=g)) % V
    return base, donor


def answers(model, base, donor, t):
    """The base's and the donor's most likely answers at the last token (the two answers a, b)."""
    a = clean_logits(model, base, t)[:, -1].argmax(-1)
    b = clean_logits(model, donor, t)[:, -1].argmax(-1)
    b = torch.where(a == b, (a + 1) % V, b)
    return a, b


def fraction(model, base, donor, t, layers, a, b) -> float:
    ld = {k: logit_diff(x, a, b) for k, x in (("base", clean_logits(model, base, t)[:, -1]),
                                             ("donor", clean_logits(model, donor, t)[:, -1]),
                                             ("patched", patched_logits(model, base, donor, Swap(t, tuple(layers)))
                                              [:, -1]))}
    return swap_fraction(ld["patched"], ld["base"], ld["donor"])


def test_only_the_recurrent_path_carries_the_value():
    m = build("pattern:WK", window=1)
    assert layers_of(m, "recurrent") == [1] and layers_of(m, "cache") == [0]
    base, donor = pair()
    t = base.shape[1] - 2
    a, b = answers(m, base, donor, t)
    assert fraction(m, base, donor, t, layers_of(m, "recurrent"), a, b) == pytest.approx(1.0, abs=1e-6)
    assert fraction(m, base, donor, t, layers_of(m, "cache"), a, b) == pytest.approx(0.0, abs=1e-6)


def test_only_the_caches_carry_the_value_when_the_state_is_silent():
    m = build("pattern:KA")
    torch.nn.init.zeros_(m.blocks[0].token.o_proj.weight)   # the recurrent layer writes nothing
    base, donor = pair()
    t = base.shape[1] - 2
    a, b = answers(m, base, donor, t)
    assert fraction(m, base, donor, t, [0], a, b) == pytest.approx(0.0, abs=1e-6)
    assert fraction(m, base, donor, t, [1], a, b) == pytest.approx(1.0, abs=1e-6)


def test_layer_sweep_gives_the_one_recurrent_layer_everything():
    m = build("pattern:WKW", window=1, n_layers=2)
    base, donor = pair(seed=3)
    t = base.shape[1] - 2
    a, b = answers(m, base, donor, t)
    rows = layer_sweep(m, base, donor, t, a, b)
    assert [r["store"] for r in rows] == ["cache", "recurrent"]
    fr = [swap_fraction(torch.tensor([r["ld_sum"]]), torch.tensor([r["ld_base_sum"]]),
                        torch.tensor([r["ld_donor_sum"]])) for r in rows]
    assert fr[0] == pytest.approx(0.0, abs=1e-6) and fr[1] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("t", [4, 9, 12])
def test_swapping_every_layer_is_the_spliced_sequence(t):
    m = build("hybrid")
    base, donor = pair(seed=1)
    spliced = torch.cat([donor[:, :t + 1], base[:, t + 1:]], dim=1)
    got = patched_logits(m, base, donor, Swap(t, tuple(layers_of(m, "all"))))
    assert torch.equal(got, clean_logits(m, spliced, t))


def test_donor_equal_to_base_changes_nothing():
    m = build("hybrid")
    base, _ = pair(seed=2)
    for t in (0, 5, base.shape[1] - 2):
        for which in ("recurrent", "cache", "all"):
            got = patched_logits(m, base, base.clone(), Swap(t, tuple(layers_of(m, which))))
            assert torch.equal(got, clean_logits(m, base, t))


@pytest.mark.parametrize("name", ["hybrid", "pattern:GW"])
def test_swap_in_decoding_equals_swap_in_prefill(name):
    m = build(name, window=3)
    base, donor = pair(T=16, seed=4)
    P = 9                                                    # prompt: 9 tokens; the rest decoded one by one
    for t in (P - 1, P + 2, 13):
        sw = Swap(t, tuple(layers_of(m, "recurrent")))
        assert_close(patched_logits(m, base, donor, sw, prompt_len=P), patched_logits(m, base, donor, sw),
                     atol=1e-5, what=f"t={t}")


def test_generate_with_a_swap_follows_the_patched_logits():
    m = build("hybrid")
    base, donor = pair(T=10, seed=5)
    P, k = 6, 6
    for t in (3, P - 1, P + 1):
        sw = Swap(t, tuple(layers_of(m, "recurrent")))
        new = generate(m, base[:, :P], k, sw, donor)
        seq = torch.cat([base[:, :P], new], dim=1)
        lg = patched_logits(m, seq, donor if donor.shape[1] > t else seq, sw, prompt_len=P)
        # the logits after t predict the tokens from t + 2 on; those from P on were generated
        pred = lg[:, :-1].argmax(-1)
        assert torch.equal(pred[:, max(0, P - t - 2):], seq[:, max(t + 2, P):])
    plain = generate(m, base[:, :P], k)                      # a donor that is the base's own run: nothing changes
    own = torch.cat([base[:, :P], plain], dim=1)
    assert torch.equal(generate(m, base[:, :P], k, Swap(P + 1, (0, 3)), own), plain)


def test_errors_name_the_position():
    m = build("hybrid")
    base, donor = pair()
    with pytest.raises(ValueError, match="t: position 14"):
        patched_logits(m, base, donor, Swap(14, (0,)))
    with pytest.raises(ValueError, match="t: position 13 leaves no token"):
        patched_logits(m, base, donor, Swap(13, (0,)))
    with pytest.raises(ValueError, match="t: position 9 is outside"):
        patched_logits(m, base, donor[:, :9], Swap(9, (0,)))
    with pytest.raises(ValueError, match="batch sizes differ"):
        patched_logits(m, base, donor[:1], Swap(3, (0,)))
    with pytest.raises(ValueError, match="layers: layer 7"):
        patched_logits(m, base, donor, Swap(3, (7,)))
    with pytest.raises(ValueError, match="layers: one of"):
        layers_of(m, "attention")
