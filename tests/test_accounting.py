"""Accounting from the config alone: worked example 2, V4.1-Flash's 890 bytes per token,
parameters beside the publishers', and analytic vs measured state after a prefill."""

import json

import pytest
import torch
from typer.testing import CliRunner

from storelab.cli import app
from storelab.models.accounting import (analytic_state_bytes, compare_published, count_params, layer_rows,
                                        memory_report)
from storelab.models.model import Model, cache_bytes_by_kind, prefill
from storelab.stores import REGISTRY
from storelab.zoo import load_zoo, zoo_names

L = 1_000_000


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _ready(name: str) -> bool:
    from storelab.models.config import read_file
    from storelab.zoo import zoo_path

    try:
        d = read_file(zoo_path(name))
    except ValueError:  # no file yet
        return False
    return {s["kind"] for s in d["stores"].values()} <= set(REGISTRY)


def need(*names):
    for n in names:
        if not _ready(n):
            pytest.skip(f"{n}: store kinds not written yet")


@pytest.fixture(scope="module")
def memory_json():
    """``storelab memory --context 1000000 --json`` for every zoo model that loads."""
    names = [n for n in zoo_names() if _ready(n)]
    r = CliRunner().invoke(app, ["memory", *names, "--context", str(L), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # docs/memory.schema.json: per model its layers and their total
    return [{**row, "model": rec["model"]} for rec in doc["models"]
            for row in [*rec["layers"], {**rec["total"], "layer": "total", "kind": "total"}]]


def rows_of(records, model, kind=None):
    return [r for r in records if r["model"] == model and r["layer"] != "total" and (kind is None or r["kind"] == kind)]


# -- worked example 2: a million tokens, five ways --------------------------------------------
def test_memory_json_keys(memory_json):
    for r in memory_json:
        assert {"model", "layer", "kind", "kept", "read", "bytes_per_token"} <= set(r)
    totals = [r for r in memory_json if r["layer"] == "total"]
    assert {t["model"] for t in totals} == {r["model"] for r in memory_json}


def test_full_attention_keeps_and_reads_everything(memory_json):
    (g,) = [r for r in rows_of(memory_json, "mimo-v2.6-pro") if r["layer"] == 0]
    assert (g["kind"], g["kept"], g["read"]) == ("attention", L, L)


def test_window_keeps_and_reads_128(memory_json):
    w = rows_of(memory_json, "mimo-v2.6-pro", "window")
    assert len(w) == 60 and all((r["kept"], r["read"]) == (128, 128) for r in w)


def test_msa_reads_16_blocks_of_128_per_group(memory_json):
    need("minimax-m3")
    m = rows_of(memory_json, "minimax-m3", "msa")
    assert len(m) == 57 and all((r["kept"], r["read"], r["scored"]) == (L, 2048, L) for r in m)
    assert load_zoo("minimax-m3").layers[3].token.n_kv_heads == 4  # per each of four groups of heads


def test_csa_keeps_a_quarter_and_reads_1024_plus_the_window(memory_json):
    need("deepseek-v4-pro")
    c = rows_of(memory_json, "deepseek-v4-pro", "csa")
    assert len(c) == 30
    assert all((r["kept"], r["read"], r["scored"]) == (250_000, 1024 + 128, 250_000) for r in c)


def test_hca_keeps_about_7800_and_reads_them_all(memory_json):
    need("deepseek-v4-pro")
    h = rows_of(memory_json, "deepseek-v4-pro", "hca")
    assert len(h) == 31
    for r in h:
        assert r["kept"] == L // 128 == 7812 and r["read"] == r["kept"] + 128 and r["scored"] == 0


def test_recurrent_layer_keeps_a_fixed_matrix_per_head():
    need("kimi-k3")
    cfg = load_zoo("kimi-k3")
    (i, kda) = next((i, lay.token) for i, lay in enumerate(cfg.layers) if lay.token.KIND == "kda")
    small, big = kda.footprint(1000), kda.footprint(L)
    assert small.state_bytes == big.state_bytes > 0
    assert big.kept == small.kept == kda.n_heads   # one matrix per head


def test_v41_flash_global_cache_is_890_bytes_per_token():
    need("deepseek-v4.1-flash")
    cfg = load_zoo("deepseek-v4.1-flash")
    recs = memory_report(cfg, L, dtype="fp4")
    total = recs[-1]
    assert total["global_bytes_per_token"] == 890          # 2.5 entries x 356 bytes
    owners = [r for r in recs[:-1] if r["global_bytes_per_token"]]
    assert [(r["layer"], r["global_bytes_per_token"]) for r in owners] == [(2, 178), (8, 178), (14, 178), (20, 356)]
    # everything the cache holds (windows, index keys included) stays near it
    assert 890 < total["average_bytes_per_token"] < 1.1 * 890
    # the two terms, in the published formats: the 890 plus index keys (fp4) per token, windows fixed
    assert total["cache_bytes_per_token"] == 890 and total["bytes_per_token"] == 890 + 3 * 68 / 2 + 68
    # shared caches are held once: readers of layer 2's cache keep nothing of their own
    assert all(r["state_bytes"] == 0 for r in recs[:-1] if r["cache_owner"] != r["layer"])


def test_memory_cli_reproduces_the_890(tmp_path):
    need("deepseek-v4.1-flash")
    r = CliRunner().invoke(app, ["memory", "deepseek-v4.1-flash", "--context", str(L), "--dtype", "fp4", "--json"])
    assert r.exit_code == 0, r.output
    (rec,) = json.loads(r.stdout)["models"]
    assert rec["total"]["cache_bytes_per_token"] == 890   # the global cache (version 1's global_bytes_per_token)


# -- parameters ---------------------------------------------------------------------------------
def test_counts_need_no_weights(monkeypatch):
    """Full-scale accounting never builds a module."""
    for cls in REGISTRY.values():
        monkeypatch.setattr(cls, "build", lambda self, *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    for n in zoo_names():
        if _ready(n):
            cfg = load_zoo(n)
            assert count_params(cfg).stored > 1e11
            layer_rows(cfg, L)


@pytest.mark.parametrize("name", zoo_names())
def test_analytic_parameters_equal_the_built_tiny_model(name):
    need(name)
    cfg = load_zoo(name, tiny=True)
    model = Model(cfg)
    # learned numbers: parameters, and float buffers such as the routers' balancing bias
    # (integer buffers -- hash tables, hash multipliers -- are addresses, not parameters)
    learned = sum(p.numel() for p in model.parameters())
    learned += sum(b.numel() for b in model.buffers() if b.is_floating_point())
    assert count_params(cfg).stored == learned


@pytest.mark.parametrize("name", zoo_names())
def test_parameters_beside_the_publishers(name):
    """Within 3 % of the publisher's figure, or the zoo file explains the difference."""
    need(name)
    cfg = load_zoo(name)
    c = compare_published(cfg)
    for key in ("stored_ratio", "active_ratio", "active_prefill_ratio", "engram_ratio"):
        ratio = c.get(key)
        if ratio is not None and abs(ratio - 1) > 0.03:
            assert cfg.published.note, f"{name}: {key} = {ratio:.3f} and no explanation"
        if ratio is not None:
            assert 0.8 < ratio < 1.3, f"{name}: {key} = {ratio:.3f}"


def test_mimo_counts_reproduce_the_config_dump():
    cfg = load_zoo("mimo-v2.6-pro")
    c = compare_published(cfg)
    assert abs(c["stored"] / 1_023_244_718_976 - 1) < 0.003  # V2.5-Pro dump, same shapes
    assert abs(c["active_ratio"] - 1) < 0.01


def test_v41_flash_active_split():
    need("deepseek-v4.1-flash")
    pa = count_params(load_zoo("deepseek-v4.1-flash"))
    assert pa.active_prefill < 0.6 * pa.active          # the prompt passes through the encoder only
    assert abs(pa.engram / 196e9 - 1) < 0.01


# -- analytic vs measured state after prefilling each tiny model ----------------------------------
@pytest.mark.parametrize("name", zoo_names())
def test_analytic_equals_measured_state_after_prefill(name):
    need(name)
    cfg = load_zoo(name, tiny=True)
    torch.manual_seed(0)
    model = Model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 13))
    _, cache = prefill(model, ids, chunk=5)
    assert model.unshared == []                      # every reader of a shared cache holds no copy
    measured = cache_bytes_by_kind(model, cache)
    analytic = analytic_state_bytes(cfg, [st.seen for st in cache], dtype="fp32")   # shared caches once
    assert measured == analytic
    for i, (lay, st) in enumerate(zip(cfg.layers, cache)):
        if cfg.owns_cache(i):
            assert st.token.entries == lay.token.footprint(st.seen).kept, f"layer {i}"
        else:
            assert st.token.nbytes() == 0, f"layer {i} reads layer {lay.cache_owner}'s cache"
