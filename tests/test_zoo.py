"""The zoo: the seven and the variants match the essay's table; tiny versions keep the
layer pattern and store kinds; the ``models``, ``memory`` and ``generate`` commands."""

import json

import pytest
import torch
from typer.testing import CliRunner

from storelab.cli import app
from storelab.stores import REGISTRY
from storelab.zoo import SEVEN, VARIANTS, load_zoo, zoo_names, zoo_path

# the essay's table (section 5): layers, token mixing, experts chosen / available (+ shared)
ESSAY = {
    "mimo-v2.6-pro": (70, "60 window + 10 full", (8, 384, 0)),
    "kimi-k3": (93, "69 kda + 24 mla", (16, 896, 2)),
    "qwen3.8": (92, "69 gated_deltanet + 23 full", (10, 512, 1)),
    "glm-5.3": (78, "78 dsa", (8, 256, 1)),
    "deepseek-v4-pro": (61, "31 hca + 30 csa", (6, 384, 1)),
    "deepseek-v4.1-flash": (40, "20 hierarchical + 18 csa + 2 window", (6, 384, 1)),
    "minimax-m3": (60, "57 msa + 3 full", (4, 128, 1)),
    "minimax-m3.1-flash": (60, "60 msa", (4, 128, 1)),
    "kimi-k3.1-pro": (93, "69 kda + 24 dsa", (16, 896, 2)),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def ready(name: str, tiny: bool = False) -> None:
    from storelab.models.config import read_file

    try:
        d = read_file(zoo_path(name, tiny))
    except ValueError as e:
        pytest.skip(f"{name}: {e}")
    missing = sorted({s["kind"] for s in d["stores"].values()} - set(REGISTRY))
    if missing:
        pytest.skip(f"{name}: store kinds not written yet: {missing}")


def test_zoo_lists_the_seven_then_the_variants():
    names = zoo_names()
    assert names == [n for n in (*SEVEN, *VARIANTS) if n in names]
    assert {"mimo-v2.6-pro", "glm-5.3", "deepseek-v4-pro", "deepseek-v4.1-flash", "minimax-m3"} <= set(names)


@pytest.mark.parametrize("name", list(ESSAY))
def test_matches_the_essay_table(name):
    ready(name)
    cfg = load_zoo(name)
    n_layers, mix, (top_k, n_experts, n_shared) = ESSAY[name]
    assert (cfg.n_layers, cfg.mix()) == (n_layers, mix)
    moes = [lay.channel for lay in cfg.layers if lay.channel.KIND == "moe"]
    assert moes and all((m.top_k, m.n_experts, m.n_shared) == (top_k, n_experts, n_shared) for m in moes)


def test_layer_positions():
    mimo = load_zoo("mimo-v2.6-pro")
    assert [i for i, lay in enumerate(mimo.layers) if lay.token.KIND == "attention"] == [0, 7, 15, 23, 31, 39, 47, 55, 62, 69]
    assert all(lay.token.window == 128 for lay in mimo.layers if lay.token.KIND == "window")
    ready("glm-5.3")
    glm = load_zoo("glm-5.3")
    own = [i for i, lay in enumerate(glm.layers) if lay.token.runs_indexer]
    assert own[:4] == [0, 1, 2, 6] and own[-1] == 74 and len(own) == 21          # IndexShare
    assert glm.layers[5].selection_owner == 2
    ready("deepseek-v4-pro")
    v4 = load_zoo("deepseek-v4-pro")
    assert [lay.token.KIND for lay in v4.layers[:5]] == ["hca", "hca", "csa", "hca", "csa"]
    assert [lay.channel.routing for lay in v4.layers[:4]] == ["hash", "hash", "hash", "learned"]
    assert v4.layers[0].depth.KIND == "mhc"


def test_v41_flash_is_an_encoder_decoder_with_four_shared_caches():
    ready("deepseek-v4.1-flash")
    cfg = load_zoo("deepseek-v4.1-flash")
    assert (cfg.encoder_layers, cfg.decoder_tail) == (20, 128)
    owners = [lay.cache_owner for lay in cfg.layers]
    assert owners[:2] == [None, None]
    assert owners[2:20] == [2] * 6 + [8] * 6 + [14] * 6
    assert owners[20:] == [20] * 20
    assert [i for i, lay in enumerate(cfg.layers) if lay.lookup is not None] == [1, 14]
    roles = [lay.token.role for lay in cfg.layers[20:]]
    assert roles[:5] == ["root", "reuse", "reuse", "reuse", "refresh"]
    assert cfg.layers[0].depth.single_pass


def test_kimi_k3_pattern_and_attnres():
    ready("kimi-k3")
    cfg = load_zoo("kimi-k3")
    full = [i + 1 for i, lay in enumerate(cfg.layers) if lay.token.KIND == "mla"]  # 1-based, as published
    assert full == list(range(4, 93, 4)) + [93]
    depth = cfg.layers[0].depth
    assert depth.KIND == "attnres" and depth.max_sources(cfg.n_layers) == 9       # "up to nine sources"


@pytest.mark.parametrize("name", zoo_names())
def test_tiny_keeps_the_pattern_and_store_kinds(name):
    ready(name)
    ready(name, tiny=True)
    full, tiny = load_zoo(name), load_zoo(name, tiny=True)

    def shape(cfg):
        return {
            "token": {lay.token.KIND for lay in cfg.layers},
            "channel": {lay.channel.KIND for lay in cfg.layers},
            "depth": cfg.layers[0].depth.KIND,
            "lookup": {lay.lookup.KIND for lay in cfg.layers if lay.lookup is not None},
            "shares_cache": any(not cfg.owns_cache(i) for i in range(cfg.n_layers)),
            "encoder": cfg.encoder_layers > 0,
            "first": cfg.layers[0].token.KIND, "last": cfg.layers[-1].token.KIND,
        }

    assert shape(tiny) == shape(full)
    assert tiny.n_layers <= 16 and tiny.d_model <= 128 and tiny.vocab_size <= 512


# -- commands ----------------------------------------------------------------------------------
def test_models_json_lists_the_zoo():
    r = CliRunner().invoke(app, ["models", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [d["name"] for d in data] == zoo_names()
    mimo = data[0]
    assert (mimo["layers"], mimo["mix"]) == (70, "60 window + 10 full")
    assert abs(mimo["params"]["stored_ratio"] - 1) < 0.03


def test_models_table_and_user_file(tmp_path):
    r = CliRunner().invoke(app, ["models"])
    assert r.exit_code == 0 and "MiMo" in r.stdout
    if "kimi-k3" in zoo_names():  # a ratio off by more than 3 % comes with its explanation
        assert "Kimi K3: Active:" in r.stdout
    cfg = load_zoo("mimo-v2.6-pro", tiny=True)
    cfg.save(tmp_path / "my.toml")
    r = CliRunner().invoke(app, ["models", "--config", str(tmp_path / "my.toml"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)[0]["mix"] == "3 window + 2 full"


def test_models_reports_a_bad_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('name = "x"\nd_model = 8\nvocab_size = 8\nn_layers = 2\n[stores.a]\nkind = "nope"\n'
                 '[[layers]]\ntoken = "a"\nchannel = "a"\ndepth = "a"\n')
    r = CliRunner().invoke(app, ["models", "--config", str(p)])
    assert r.exit_code == 2
    assert "bad.toml: layer 0: token store 'a': kind: unknown store kind 'nope'" in r.output.replace("\n", "")


def test_memory_table_and_plot(tmp_path):
    r = CliRunner().invoke(app, ["memory", "mimo-v2.6-pro", "--context", "1000000"])
    assert r.exit_code == 0, r.output
    assert "window" in r.stdout and "1,000,000" in r.stdout
    out = tmp_path / "mem.png"
    r = CliRunner().invoke(app, ["memory", "--plot", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    side = json.loads(out.with_suffix(".json").read_text())
    assert set(side["series"]) == set(zoo_names())
    s = side["series"]["mimo-v2.6-pro"]
    assert s[0]["context"] == 1000 and s[-1]["context"] == 1_000_000


def test_generate_reports_measured_beside_analytic():
    r = CliRunner().invoke(app, ["generate", "minimax-m3", "--tiny", "--prompt-len", "9", "--new-tokens", "3",
                                 "--chunk", "4", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["tokens"]) == 3
    assert {s["kind"] for s in d["state"]} == {"attention", "msa"}
    assert all(s["measured_bytes"] == s["analytic_bytes"] > 0 for s in d["state"])
    r = CliRunner().invoke(app, ["generate", "mimo-v2.6-pro", "--tiny", "--prompt-len", "5", "--new-tokens", "2"])
    assert r.exit_code == 0 and "Measured" in r.stdout


def test_generate_runs_a_model_file(tmp_path):
    load_zoo("minimax-m3", tiny=True).save(tmp_path / "m.json")
    r = CliRunner().invoke(app, ["generate", "--config", str(tmp_path / "m.json"), "--prompt-len", "6",
                                 "--new-tokens", "2", "--temperature", "0.8", "--json"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["tokens"]) == 2
    r = CliRunner().invoke(app, ["generate", "no-such-model", "--tiny"])
    assert r.exit_code == 2 and "unknown zoo model" in r.output
