"""The checks every checkpoint family's tests make against transformers 5.23's tiny model of the family.

A family test file keeps its own tiny settings (``TINY``: a name per setting) and its own checks of what it
reads; the checks every family shares live here, once:

* ``tiny_hf(model_type, settings)``: a tiny random transformers model whose constant tensors (norms, biases,
  sinks, routing biases) are perturbed, so that a wrong name mapping or a missing ``1 + w`` shows in the logits;
* ``saved_fixture(TINY, model_type_of)``: a module-scoped fixture ``saved(name) -> (hf, folder)``, each setting
  built and written with ``save_pretrained`` once;
* ``check_logits``: our logits from the loaded folder equal transformers' in fp32 (1e-5 of their scale), and a
  chunked prefill followed by single tokens equals one pass;
* ``check_bf16``: the same model loaded in bf16 against transformers' in bf16 (a fraction of the scale);
* ``check_cache``: ``engines.state_bytes(engine="transformers")`` equals the bytes transformers' cache holds
  after a prefill of T tokens (each storage once);
* ``check_counts``: parameters from config.json alone equal the floating-point numbers transformers saves.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close

SPLITS = ((0, 5), (5, 13), (13, 14), (14, 21))  # a chunked prefill of 21 tokens, single tokens among the calls


def ids_of(T: int, seed: int = 7, vocab: int = 128) -> torch.Tensor:
    return torch.randint(3, vocab, (1, T), generator=torch.Generator().manual_seed(seed))


def cache_bytes(past) -> int:
    """Bytes of every tensor transformers' cache layers hold as attributes (each storage once)."""
    seen, total = set(), 0
    for layer in past.layers:
        for v in vars(layer).values():
            if isinstance(v, torch.Tensor) and v.numel():
                key = v.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += v.untyped_storage().nbytes()
    return total


def tiny_hf(model_type: str, settings: dict, *, perturb: float = 0.1):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **settings)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in hf.state_dict().values():
            if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                t.add_(perturb * torch.randn(t.shape, generator=g))
    return hf


def saved_fixture(tiny: dict, model_type_of: Callable[[str], str], *, perturb: float = 0.1):
    """A module-scoped fixture: ``saved(name)`` is (transformers model, the folder it was saved to)."""
    built: dict = {}

    @pytest.fixture(scope="module")
    def saved(tmp_path_factory):
        def get(name: str):
            if name not in built:
                hf = tiny_hf(model_type_of(name), tiny[name], perturb=perturb)
                d = tmp_path_factory.mktemp(name)
                hf.save_pretrained(d)
                built[name] = (hf, d)
            return built[name]

        yield get
        built.clear()

    return saved


def check_logits(hf, folder, *, what: str, splits=SPLITS) -> None:
    ours = load(folder)
    ids = ids_of(splits[-1][1])
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
        tol = 1e-5 * ref.abs().max().item()
        assert_close(got, ref, atol=tol, what=f"{what} logits")
        cache, parts = None, []
        for a, b in splits:
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=tol, what=f"{what} chunked")


def check_bf16(hf, folder, *, what: str, within: float = 0.05) -> None:
    ours = load(folder, dtype="bf16")
    ids = ids_of(13)
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(ids).logits.float()
        hf.to(torch.float32)
        got = ours(ids)[0].float()
    scale, err = ref.abs().max().item(), (got - ref).abs().max().item()
    assert err <= within * scale, f"{what}: bf16 logits differ by {err:.3e} (scale {scale:.3e})"


def check_cache(hf, folder, T: int, *, counter: Callable = cache_bytes) -> None:
    from storelab.models.engines import state_bytes

    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == counter(past)


def check_counts(hf, folder, *, leave_out: tuple[str, ...] = ()) -> None:
    """Parameters from config.json alone equal the saved floating-point tensors (buffers such as a routing bias
    included, a tied matrix once); ``leave_out``: name parts of tensors that are not the text model's (a
    wrapper's vision tower), each of which must occur."""
    from storelab.models.accounting import count_params

    cfg = read_model_config(folder / "config.json")
    state = hf.state_dict()
    for part in leave_out:
        assert any(part in k for k in state), f"no saved tensor named like {part!r} to leave out"
    text = [t for k, t in state.items() if not any(part in k for part in leave_out)]
    held = {t.data_ptr(): t.numel() for t in text if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())
    check_declared_stores(folder / "config.json", cfg)


def check_declared_stores(path, cfg) -> None:
    """Every store kind the model built is one its family declares (``Family.stores``: what ``storelab
    families`` prints)."""
    import json

    from storelab.checkpoint.families import family_for

    fam = family_for(json.loads(open(path).read()))
    built = {s.KIND for layer in cfg.layers for s in layer.stores().values()}
    assert fam.stores == ("any",) or built <= set(fam.stores), \
        f"{path}: family {fam.name} builds {sorted(built - set(fam.stores))}, not in its declared stores"
