"""Property tests (hypothesis): a model file with any one value changed, and any values of
``generate``'s numeric options, either run or are refused with a named error, never another
exception (issue 20)."""

from __future__ import annotations

import copy
import re
import tomllib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from storelab.cli import app
from storelab.models.config import ModelConfig

BASE = tomllib.loads("""
name = "m"
d_model = 16
vocab_size = 32
n_layers = 3
context = 64

[stores.attn]
kind = "attention"
n_heads = 2
head_dim = 8

[stores.kda]
kind = "kda"
n_heads = 2
head_k_dim = 8

[stores.ffn]
kind = "ffn"
d_ff = 32

[stores.res]
kind = "residual"

[[layers]]
at = "all"
pattern = "KA"
token = { K = "kda", A = "attn" }
channel = "ffn"
depth = "res"
""")

# every place one value can be changed: (path, ...) into the dict
PATHS = [("name",), ("d_model",), ("vocab_size",), ("n_layers",), ("context",), ("norm_eps",), ("tie_embeddings",),
         ("stores", "attn", "n_heads"), ("stores", "attn", "head_dim"), ("stores", "attn", "kind"),
         ("stores", "attn", "window"), ("stores", "kda", "n_heads"), ("stores", "kda", "head_k_dim"),
         ("stores", "kda", "beta_max"), ("stores", "kda", "mode"), ("stores", "ffn", "d_ff"),
         ("stores", "ffn", "activation"), ("stores", "res", "kind"), ("stores", "attn"), ("stores",),
         ("layers",), ("layers", 0), ("layers", 0, "at"), ("layers", 0, "pattern"), ("layers", 0, "token"),
         ("layers", 0, "channel"), ("layers", 0, "cache_owner"), ("layers", 0, "lookup"), ("published",)]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=6), st.sampled_from(["all", "0:2", "30:40", "-1", "KA", "attn", "kda", "ffn",
                                                          "previous", "chunk", "swiglu"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                      max_leaves=6)


def _set(d, path, value):
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=values)
def test_a_changed_model_file_parses_or_names_the_field(path, value):
    d = copy.deepcopy(BASE)
    _set(d, path, value)
    try:
        cfg = ModelConfig.from_dict(d, source="m.toml")
    except ValueError as e:
        assert str(e).startswith("m.toml: ") and re.search(r"[a-z_\]]+: ", str(e)), str(e)
        return
    from storelab.models.accounting import count_params
    from storelab.models.model import Model

    if count_params(cfg).stored < 2_000_000:  # what parses, runs
        with torch.no_grad():
            logits, _ = Model(cfg).eval()(torch.zeros(1, 3, dtype=torch.long))
        assert logits.shape == (1, 3, cfg.vocab_size)


numbers = st.one_of(st.integers(-10, 40).map(str), st.integers(2**62, 2**70).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(str), st.sampled_from(["abc", "", "1e3", "-0"]))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from storelab.models.config import ModelConfig as MC

    f = tmp_path_factory.mktemp("fuzz") / "m.toml"
    MC.from_dict(copy.deepcopy(BASE)).save(f)
    return f


@settings(max_examples=30, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(["--chunk", "--temperature", "--top-k", "--seed", "--prompt-len", "--new-tokens"]),
       value=numbers)
def test_generate_options_run_or_exit_2(model_file, option, value):
    res = CliRunner().invoke(app, ["generate", "--config", str(model_file), "--prompt-len", "5", "--new-tokens", "2",
                                   option, value, "--json"])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"{option} {value!r}: {type(res.exception).__name__}: {res.exception}")
    assert res.exit_code in (0, 2), res.output
    if res.exit_code == 2:
        assert option in res.output or option.lstrip("-").replace("-", "_") in res.output, res.output
