"""``storelab memory --json`` against its schema (docs/memory.schema.json) and its invariants (issue 30, kind 6):
one meaning per field, in the formats asked for; the total is the per-token term times L plus the per-sequence
term, times the batch; a part never exceeds its total; the total at L is what the model holds at L."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from storelab.cli import app
from storelab.report.memory_json import BYTE_FIELDS, COUNT_FIELDS, SCHEMA_VERSION, memory_record
from storelab.zoo import load_zoo, zoo_names

SCHEMA = json.loads((Path(__file__).parents[1] / "docs" / "memory.schema.json").read_text())
FORMATS = ["fp32", "bf16", "fp16", "fp8", "fp4", "q8_0", "q4_0"]
CASES = settings(max_examples=25, deadline=None, derandomize=True)


def validate(doc, schema: dict, where: str = "$") -> None:
    """The part of JSON Schema the file uses: type, const, enum, minimum, required, properties,
    additionalProperties, items."""
    types = schema.get("type")
    if types is not None:
        ok = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
              "integer": int, "number": (int, float)}
        names = types if isinstance(types, list) else [types]
        assert any(isinstance(doc, ok[t]) and not (t in ("integer", "number") and isinstance(doc, bool))
                   for t in names), f"{where}: {doc!r} is not {types}"
    if "const" in schema:
        assert doc == schema["const"], f"{where}: {doc!r} != {schema['const']!r}"
    if "enum" in schema:
        assert doc in schema["enum"], f"{where}: {doc!r} not in {schema['enum']}"
    if "minimum" in schema and isinstance(doc, (int, float)):
        assert doc >= schema["minimum"], f"{where}: {doc} < {schema['minimum']}"
    if isinstance(doc, dict):
        for k in schema.get("required", []):
            assert k in doc, f"{where}: no field {k!r}"
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            extra = set(doc) - set(props)
            assert not extra, f"{where}: fields the schema does not name: {sorted(extra)}"
        for k, v in doc.items():
            if k in props:
                validate(v, props[k], f"{where}.{k}")
    if isinstance(doc, list) and "items" in schema:
        for i, v in enumerate(doc):
            validate(v, schema["items"], f"{where}[{i}]")


def memory_json(*args) -> dict:
    r = CliRunner().invoke(app, ["memory", *map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def check_invariants(rec: dict) -> None:
    L, B, tot = rec["context"], rec["batch"], rec["total"]
    close = lambda a, b: a == pytest.approx(b, rel=1e-9, abs=1e-6)  # noqa: E731
    assert close(tot["total_bytes"], B * (tot["bytes_per_token"] * L + tot["bytes_per_sequence"]))
    assert tot["total_bytes"] <= B * (tot["bytes_per_token"] * L + tot["bytes_per_sequence_full"]) * (1 + 1e-12)
    assert tot["cache_bytes_per_token"] <= tot["bytes_per_token"] * (1 + 1e-12)
    assert tot["bytes_per_sequence"] <= tot["bytes_per_sequence_full"] * (1 + 1e-12)
    for k in (*BYTE_FIELDS, *COUNT_FIELDS):  # the total is the sum of its parts, and no part exceeds it
        assert close(sum(lay[k] for lay in rec["layers"]), tot[k]), k
        assert all(lay[k] <= tot[k] * (1 + 1e-12) + 1e-9 for lay in rec["layers"]), k
    for lay in rec["layers"]:
        assert close(lay["total_bytes"], B * (lay["bytes_per_token"] * L + lay["bytes_per_sequence"]))
        assert lay["cache_bytes_per_token"] <= lay["bytes_per_token"] * (1 + 1e-12)
        if lay["cache_owner"] != lay["layer"]:
            assert lay["kept"] == 0


def test_the_document_follows_its_schema_file():
    doc = memory_json("kimi-k3", "deepseek-v4.1-flash", "--context", 3000, "--batch", 4, "--budget", "24GiB")
    assert doc["schema_version"] == SCHEMA_VERSION == SCHEMA["properties"]["schema_version"]["const"]
    validate(doc, SCHEMA)
    for rec in doc["models"]:
        check_invariants(rec)
        assert rec["budget"]["longest_context"]


@CASES
@given(name=st.sampled_from(zoo_names()), tiny=st.booleans(), context=st.integers(1, 1 << 22),
       batch=st.integers(1, 64), cache=st.sampled_from([None, *FORMATS]), state=st.sampled_from(["fp32", "bf16"]))
def test_invariants_hold_for_every_model_context_batch_and_format(name, tiny, context, batch, cache, state):
    rec = memory_record(load_zoo(name, tiny=tiny), context, cache=cache, state=state, batch=batch)
    validate(rec, SCHEMA["properties"]["models"]["items"])
    check_invariants(rec)


@CASES
@given(name=st.sampled_from(zoo_names()), context=st.integers(1, 6000))
def test_the_total_at_l_is_what_the_model_holds_at_l(name, context):
    """In fp32 the total equals the stores' own footprints at L (a window of 128 at L = 3 holds 3 entries)."""
    from storelab.models.accounting import analytic_state_bytes

    cfg = load_zoo(name, tiny=True)
    rec = memory_record(cfg, context, cache="fp32", state="fp32", batch=1)
    held = sum(analytic_state_bytes(cfg, [context] * cfg.n_layers, dtype="fp32").values())
    assert rec["total"]["total_bytes"] == pytest.approx(held, rel=1e-9)


@CASES
@given(name=st.sampled_from(zoo_names()), cache=st.sampled_from([None, *FORMATS]))
def test_every_byte_field_is_in_the_format_asked_for(name, cache):
    """Halving the cache format halves the cache's per-token bytes and nothing else (no field kept in bf16)."""
    cfg = load_zoo(name, tiny=True)
    a = memory_record(cfg, 4096, cache="fp32", state="fp32", batch=1)["total"]
    b = memory_record(cfg, 4096, cache="fp16", state="fp32", batch=1)["total"]
    assert b["cache_bytes_per_token"] == pytest.approx(a["cache_bytes_per_token"] / 2)
    c = memory_record(cfg, 4096, cache=cache, state="bf16", batch=1)["total"]
    d = memory_record(cfg, 4096, cache=cache, state="fp32", batch=1)["total"]
    assert c["bytes_per_token"] == d["bytes_per_token"] and c["bytes_per_sequence"] <= d["bytes_per_sequence"]


def test_deepseek_v41_flash_at_its_published_formats():
    (rec,) = memory_json("deepseek-v4.1-flash", "--context", 1 << 20, "--batch", 4)["models"]
    tot = rec["total"]
    assert rec["cache_format"] == "published" and rec["state_format"] == "fp32"
    assert tot["cache_bytes_per_token"] == 890 and tot["bytes_per_token"] == 890 + 3 * 68 / 2 + 68
    assert tot["total_bytes"] == 4 * (tot["bytes_per_token"] * (1 << 20) + tot["bytes_per_sequence"])
    assert tot["bytes_per_sequence"] <= tot["bytes_per_sequence_full"]  # the open pools: as held at L
    old = {"state_bytes", "average_bytes_per_token", "growth_bytes_per_token", "global_bytes_per_token", "dtype",
           "cache_dtype", "bytes_per_token_by_format"}
    assert not old & set(tot) and not old & set(rec)


@pytest.mark.parametrize("name", [n for n in zoo_names() if any(lay.token.KIND == "window" or
                                                                  getattr(lay.token, "window", 0)
                                                                  for lay in load_zoo(n, tiny=True).layers)])
def test_a_short_context_counts_only_what_the_windows_hold(name):
    (rec,) = memory_json(name, "--tiny", "--context", 3)["models"]
    tot = rec["total"]
    assert tot["bytes_per_sequence"] < tot["bytes_per_sequence_full"]
    r = CliRunner().invoke(app, ["memory", name, "--tiny", "--context", "3"])
    assert r.exit_code == 0 and "at its fullest" in r.stdout
