"""The probes on text: tiny random transformers checkpoints with a tokenizer trained in the test.

``storelab probe NAME --checkpoint DIR`` on a Hugging Face folder (every family the loader reads)
and on a ``storelab save`` folder, with the shipped prompt sets and with the user's own; the
outputs (probe.json, figures) written safely; a constructed model whose answer is known (only its
recurrent layer can carry the value: the swap fractions are 1 and 0). Then ``generate --prompt``.

These models are untrained, so each probe's check (``storelab.probes.validity``) finds them not learned
and withholds their fractions and figures; the tests that read the arithmetic or the figures under the
check pass it by fiat (``unchecked``).
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from storelab.cli import app
from storelab.outputs import MANIFEST
from storelab.probes.prompts import shipped
from tests.helpers import write_tokenizer
from tests.test_checkpoint import FAMILIES, tiny_hf
from tests.test_probes import unchecked  # noqa: F401  (a fixture)

VOCAB = 1024
runner = CliRunner()


def corpus() -> str:
    """Every text of the shipped prompt sets, so that the test's BPE learns their words whole."""
    parts = []
    for r in shipped("swap") + shipped("keep_one"):
        for k in ("prompt_a", "prompt_b", "answer_a", "answer_b", "prompt"):
            parts.append(r.get(k, ""))
        for p in (r, r.get("paired", {})):
            parts += [p.get("prompt", "")] + p.get("retrieval", []) + p.get("compliance", [])
    return " ".join(parts)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """model_type -> (transformers model, its folder with tokenizer.json); each built once."""
    built, text = {}, corpus()

    def get(model_type: str):
        if model_type not in built:
            hf = tiny_hf(model_type, vocab_size=VOCAB)
            d = tmp_path_factory.mktemp(model_type)
            hf.save_pretrained(d)
            write_tokenizer(d, text, vocab=VOCAB)
            built[model_type] = (hf, d)
        return built[model_type]

    return get


def probe(*args: str):
    return runner.invoke(app, ["probe", *args], env={"COLUMNS": "400"})  # error lines unwrapped


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "kimi_linear"])
def test_every_text_probe_with_outputs(model_type, folder, tmp_path, monkeypatch):
    _, d = folder(model_type)
    checked = probe("all", "--checkpoint", str(d), "--n", "2", "--json", "--out", str(tmp_path / "checked"))
    assert checked.exit_code == 0, checked.output
    for nm, r in json.loads(checked.stdout)["results"].items():   # untrained: no fraction, no figure
        assert r["valid"] is False and "not learned" in r["reason"], (nm, r["reason"])
    r = json.loads(checked.stdout)["results"]
    assert r["state_swap"]["recurrent_fraction"] is None and r["forgetting"]["median_half_life"] is None
    assert r["keep_one"]["cache_only"]["retrieval"] is None and r["keep_one"]["chance"]["retrieval"] > 0
    assert [p.name for p in (tmp_path / "checked").iterdir() if p.name != MANIFEST] == ["probe.json"]
    from storelab.probes import validity

    monkeypatch.setattr(validity, "MARGIN", -1.0)       # the arithmetic and figures under the check
    monkeypatch.setattr(validity, "MIN_SHIFT", -1e30)
    res = probe("all", "--checkpoint", str(d), "--n", "3", "--json", "--out", str(tmp_path / "out"))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    r = doc["results"]
    assert set(r) == {"state_swap", "keep_one", "forgetting"} and set(doc["skipped"]) == {"mhc", "selection"}
    s = r["state_swap"]
    assert s["examples"] == 3 and not s["skipped"] and len(s["per_layer"]) == 4
    assert s["recurrent_layers"] and s["cache_layers"]
    assert {x["store"] for x in s["per_layer"]} == {"recurrent", "cache"}
    assert s["recurrent_fraction"] is not None and s["cache_fraction"] is not None
    k = r["keep_one"]
    assert k["examples"] == 3 and k["paired"]["examples"] >= 1 and set(k["tasks"]) == {"dictionary", "language",
                                                                                         "persona"}
    f = r["forgetting"]
    assert f["heads"] and f["median_half_life"] > 0 and f["documents"] == 3
    assert (f["kda_mixing_fraction"] is not None) == (model_type == "kimi_linear")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MANIFEST, "forgetting.png", "keep_one.png",
                                                                    "probe.json", "state_swap.png"]
    assert json.loads((tmp_path / "out" / "probe.json").read_text())["results"]["state_swap"]["per_layer"]
    table = probe("state_swap", "--checkpoint", str(d), "--n", "2", "--out", str(tmp_path / "out"))
    assert table.exit_code == 0 and "layer 3" in table.output and "wrote probe.json" in table.output


@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - {"qwen3_5_text", "kimi_linear"}))
def test_state_swap_on_every_family(model_type, folder, unchecked):
    _, d = folder(model_type)
    res = probe("state_swap", "--checkpoint", str(d), "--n", "2", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["results"]["state_swap"]
    assert s["examples"] == 2 and len(s["per_layer"]) == len(s["recurrent_layers"]) + len(s["cache_layers"])
    assert (s["recurrent_fraction"] is None) == (not s["recurrent_layers"])


def test_storelab_save_folder(folder, tmp_path):
    from storelab.checkpoint import load, save
    from storelab.outputs import folder_kind

    _, d = folder("qwen3_5_text")
    save(load(d), tmp_path / "mine")
    write_tokenizer(tmp_path / "mine", corpus(), vocab=VOCAB)
    assert folder_kind(tmp_path / "mine") == "save"
    res = probe("keep_one", "--checkpoint", str(tmp_path / "mine"), "--n", "2", "--json")
    assert res.exit_code == 0, res.output
    ours = json.loads(res.stdout)["results"]["keep_one"]
    theirs = json.loads(probe("keep_one", "--checkpoint", str(d), "--n", "2", "--json").stdout)["results"]["keep_one"]
    assert ours["per_example"] == theirs["per_example"]


def test_only_the_recurrent_layer_carries_the_value_on_text(folder, unchecked):
    """``pattern:WK``, window 1 at layer 0: the entries the window keeps at t-1, t come from the same
    tokens in both prompts, so the recurrent state moves the whole shift and the cache none."""
    from storelab.models.model import Model
    from storelab.probes.text import text_keep_one, text_state_swap
    from storelab.text import Tokenizer
    from storelab.train.models import resolve_model

    _, d = folder("qwen3_5_text")
    tok = Tokenizer.from_folder(d)
    torch.manual_seed(0)
    m = Model(resolve_model("pattern:WK", VOCAB, d_model=32, n_heads=2, head_dim=16, d_ff=64, window=1)).eval()
    r = text_state_swap(m, tok, shipped("swap"), n=6)
    assert r["recurrent_fraction"] == pytest.approx(1.0, abs=1e-5)
    assert r["cache_fraction"] == pytest.approx(0.0, abs=1e-5)
    assert [x["store"] for x in r["per_layer"]] == ["cache", "recurrent"]
    assert r["per_layer"][1]["fraction"] == pytest.approx(1.0, abs=1e-5)
    # the same swap with the answer's tokens run as decoding steps: the same figures
    dec = text_state_swap(m, tok, shipped("swap"), n=6, decode=True)
    assert dec["recurrent_fraction"] == pytest.approx(r["recurrent_fraction"], abs=1e-5)
    assert dec["logit_diff"] == pytest.approx(r["logit_diff"], abs=1e-4)
    # a swap after the first token, before any fact: the states carry nothing of the asked value
    early = text_state_swap(m, tok, shipped("swap"), n=6, position=0)
    assert early["recurrent_fraction"] == pytest.approx(0.0, abs=1e-5)
    assert early["cache_fraction"] == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="position: 10000 is outside"):
        text_state_swap(m, tok, shipped("swap"), n=6, position=10000)
    torch.manual_seed(0)
    only_state = Model(resolve_model("pattern:K", VOCAB, d_model=32, n_heads=2, head_dim=16, d_ff=64,
                                     n_layers=2)).eval()
    k = text_keep_one(only_state, tok, shipped("keep_one"), n=6)
    assert [h["state_only"] for h in k["per_example"]] == [h["full"] for h in k["per_example"]]


def test_users_prompts_and_their_errors(folder, tmp_path):
    _, d = folder("qwen3_5_text")
    mine = tmp_path / "mine.jsonl"
    rec = shipped("swap")[0]
    doc = json.dumps({"id": "doc", "text": "A short note."})
    mine.write_text(json.dumps({**rec, "id": "mine"}) + "\n" + doc + "\n")
    res = probe("state_swap", "--checkpoint", str(d), "--prompts", str(mine), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["results"]["state_swap"]["per_example"][0]["id"] == "mine"
    bad = probe("keep_one", "--checkpoint", str(d), "--prompts", str(mine))
    assert bad.exit_code == 2 and "no records of kind 'keep_one'" in " ".join(bad.output.split())
    cases = [("{not json", "line 1: not valid JSON"),
             (json.dumps({"kind": "swap", "id": "x", "prompt_a": "a", "prompt_b": "b", "answer_a": " c"}),
              "line 1: answer_b: missing"),
             (json.dumps({"kind": "keep_one", "id": "x", "task": "poetry", "prompt": "p", "retrieval": [" a"],
                          "compliance": []}), "line 1: task: one of"),
             ("\n" + json.dumps({"kind": "keep_one", "id": "x", "task": "language", "prompt": "p",
                                 "retrieval": " a", "compliance": []}), "line 2: retrieval: expected list"),
             (json.dumps({"kind": "recipe", "id": "x"}), "kind: one of")]
    for text, msg in cases:
        mine.write_text(text)
        res = probe("all", "--checkpoint", str(d), "--prompts", str(mine))
        assert res.exit_code == 2 and msg in " ".join(res.output.split()), (msg, res.output)
    res = probe("all", "--checkpoint", str(d), "--prompts", str(tmp_path / "none.jsonl"))
    assert res.exit_code == 2 and "--prompts" in " ".join(res.output.split())


@pytest.mark.parametrize("model_type, name", [("glm_moe_dsa", "selection"), ("deepseek_v4", "mhc")])
def test_document_probes_on_a_model_folder_read_the_shipped_prose(model_type, name, folder, tmp_path, unchecked):
    """selection and mhc on a Hugging Face folder: the shipped documents through its tokenizer.json."""
    _, d = folder(model_type)
    n = [] if name == "selection" else ["--n", "2"]   # selection reads every document: it takes no --n
    res = probe(name, "--checkpoint", str(d), "--contexts", "48,96", "--queries", "4", *n, "--json",
                "--out", str(tmp_path / "out"))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    r = doc["results"][name]
    if name == "selection":
        assert r["contexts"] == [48, 96] and r["layers"]
        assert all(0.0 <= p["recall"] <= 1.0 for x in r["layers"] for p in x["points"] if p["recall"] is not None)
    else:
        assert r["base_perplexity"] > 1 and set(r["conditions"]) >= {"identity_first_half", "identity_second_half"}
    assert (tmp_path / "out" / f"{name}.png").stat().st_size > 0


def test_swap_position_and_decode_from_the_command_line(folder):
    _, d = folder("qwen3_5_text")
    res = probe("state_swap", "--checkpoint", str(d), "--n", "2", "--position", "0", "--decode", "--json")
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)["results"]["state_swap"]
    assert r["position"] == 0 and r["decode"] is True
    res = probe("state_swap", "--checkpoint", str(d), "--n", "2", "--position", "10000")
    assert res.exit_code == 2 and "position: 10000 is outside" in res.output, res.output


def test_folder_errors_and_safe_outputs(folder, tmp_path):
    import shutil

    _, d = folder("qwen3_5_text")
    bare = tmp_path / "bare"
    shutil.copytree(d, bare)
    (bare / "tokenizer.json").unlink()
    res = probe("state_swap", "--checkpoint", str(bare))
    assert res.exit_code == 2 and "tokenizer.json: missing" in " ".join(res.output.split())
    mine = tmp_path / "figs"
    mine.mkdir()
    (mine / "state_swap.png").write_text("my own picture")
    res = probe("state_swap", "--checkpoint", str(d), "--n", "1", "--out", str(mine))
    assert res.exit_code == 2 and "refusing to replace" in " ".join(res.output.split())
    assert (mine / "state_swap.png").read_text() == "my own picture"
    for args, msg in ((["mhc"], "has no mHC depth mixer"), (["state_swap", "--task", "mqar", "--size", "full"], "more than the model's 1024")):
        res = probe(*args, "--checkpoint", str(d))
        assert res.exit_code == 2 and msg in " ".join(res.output.split()), res.output
    res = probe("state_swap", "--checkpoint", str(tmp_path / "nowhere"))
    assert res.exit_code == 2 and "does not exist" in " ".join(res.output.split())


# ------------------------------------------------------------------------------- generate --prompt
TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant:{% endif %}")


def generate(*args: str):
    return runner.invoke(app, ["generate", *args], env={"COLUMNS": "400"})


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "kimi_linear"])
def test_generate_text_matches_transformers(model_type, folder):
    from storelab.text import Tokenizer

    hf, d = folder(model_type)
    text = "Nora looks after the goat."
    res = generate("--checkpoint", str(d), "--prompt", text, "--new-tokens", "7", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    tok = Tokenizer.from_folder(d)
    ids = torch.tensor([tok.encode(text)])
    assert out["prompt_ids"] == ids[0].tolist()
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=7, do_sample=False,
                       eos_token_id=[1, 2], pad_token_id=0)[0, ids.shape[1]:].tolist()
    want = want[:next((i for i, x in enumerate(want) if x in (1, 2)), len(want))]
    assert out["tokens"] == want and out["text"] == tok.decode(want)
    plain = generate("--checkpoint", str(d), "--prompt", text, "--new-tokens", "7")
    assert plain.exit_code == 0 and plain.stdout.rstrip("\n") == out["text"]


def test_generate_stops_at_eos_and_chat(folder, tmp_path):
    import shutil

    _, src = folder("qwen3_5_text")
    d = tmp_path / "m"
    shutil.copytree(src, d)
    first = json.loads(generate("--checkpoint", str(d), "--prompt", "Hello", "--json").stdout)["tokens"][0]
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [first]}))
    out = json.loads(generate("--checkpoint", str(d), "--prompt", "Hello", "--json").stdout)
    assert out["tokens"] == [] and out["stopped"] == "eos" and out["text"] == ""
    res = generate("--checkpoint", str(d), "--prompt", "Hello", "--chat")
    assert res.exit_code == 2 and "tokenizer_config.json: no chat_template" in " ".join(res.output.split())
    write_tokenizer(d, corpus(), vocab=VOCAB, chat_template=TEMPLATE)
    res = generate("--checkpoint", str(d), "--prompt", "Hello", "--chat", "--json", "--new-tokens", "3")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["prompt_ids"][0] == 0   # the template's <s>, not one added on top


def test_generate_prompt_errors(folder, tmp_path):
    import shutil

    _, src = folder("qwen3_5_text")
    res = generate("tiny-kimi-k3", "--prompt", "Hello")
    assert res.exit_code == 2 and "--prompt: text needs a tokenizer" in " ".join(res.output.split())
    res = generate("--checkpoint", str(src), "--chat")
    assert res.exit_code == 2 and "--chat: wraps a --prompt" in " ".join(res.output.split())
    d = tmp_path / "broken"
    shutil.copytree(src, d)
    (d / "tokenizer.json").write_text("{broken")
    res = generate("--checkpoint", str(d), "--prompt", "Hello")
    assert res.exit_code == 2 and "tokenizer.json: not a tokenizer" in " ".join(res.output.split())
    (d / "tokenizer.json").unlink()
    res = generate("--checkpoint", str(d), "--prompt", "Hello")
    assert res.exit_code == 2 and "tokenizer.json: missing" in " ".join(res.output.split())
