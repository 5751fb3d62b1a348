"""Nothing lost, nothing misread (issue 30): generated cases of each kind end in exit code 2 with a
message naming the file, field or option, and every user file byte-identical afterwards.

1. files lost: every path a command writes or removes is one it owns (``storelab.outputs``);
3. a damaged run folder: ``export`` and a resumed ``train`` refuse it, naming the file;
5. non-finite weights or activations: an error naming the tensor, or a result marked invalid;
4. sizes the user gives: checked against what the run would hold, before it starts;
6. output a user misreads (the memory JSON's own invariants are in tests/test_memory_schema.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_bad_inputs import BASE, refused, run, snapshot, wide_console  # noqa: F401 (an autouse fixture)

FAST = settings(max_examples=8, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
NAMES = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)
CONTENT = st.binary(min_size=0, max_size=64)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A real run folder: two steps of a one-layer attention stack, checkpointed at step 2."""
    from storelab.train.loop import TrainConfig, train

    out = tmp_path_factory.mktemp("trained") / "run"
    train(TrainConfig(model="attention", steps=2, batch_size=4, eval_every=2, checkpoint_every=2,
                      eval_examples=8, model_options={"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 8,
                                                      "d_ff": 16}), out)
    return out


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(trained, d)
    return d


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (a tmp folder), byte for byte."""
    return snapshot(root)


# -- 1. files lost -------------------------------------------------------------------------------------
@FAST
@given(have=st.sampled_from(["png", "json", "both"]), body=CONTENT, suffix=st.sampled_from([".png", ".svg", ""]),
       stem=NAMES)
def test_memory_plot_keeps_the_user_s_figure_and_the_json_beside_it(tmp_path, have, body, suffix, stem):
    out = tmp_path / f"{stem}{suffix}"
    png = out if suffix else out.with_name(out.name + ".png")
    side = png.with_suffix(".json")
    for f in {"png": [png], "json": [side], "both": [png, side]}[have]:
        f.write_bytes(body)
    before = _tree(tmp_path)
    refused("memory", "kimi-k3", "--tiny", "--plot", "--out", out, says=("--out", str(png), "--force"))
    assert _tree(tmp_path) == before


def test_memory_plot_rewrites_its_own_pair_and_force_overwrites(tmp_path):
    png = tmp_path / "m.png"
    code, out = run("memory", "kimi-k3", "--tiny", "--plot", "--out", png)
    assert code == 0, out
    assert json.loads(png.with_suffix(".json").read_text())["command"] == "memory"
    code, out = run("memory", "kimi-k3", "--tiny", "--plot", "--out", png)  # its own pair: drawn again
    assert code == 0, out
    other = tmp_path / "o.png"
    other.write_bytes(b"mine")
    code, out = run("memory", "kimi-k3", "--tiny", "--plot", "--out", other, "--force")
    assert code == 0 and other.read_bytes()[:4] == b"\x89PNG", out


def test_memory_out_without_plot_is_an_error(tmp_path):
    refused("memory", "kimi-k3", "--tiny", "--out", tmp_path / "x.png", says=("--out", "--plot"))
    assert not list(tmp_path.iterdir())


def test_memory_plot_is_not_written_into_its_checkpoint(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
                                               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                                               "intermediate_size": 128, "vocab_size": 100}))
    before = _tree(tmp_path)
    refused("memory", "--checkpoint", d, "--plot", "--out", d / "m.png", says=("--out", "input"))
    assert _tree(tmp_path) == before


@FAST
@given(step=st.integers(0, 10**8 - 1), name=NAMES, body=CONTENT, real=st.booleans())
def test_train_keeps_a_user_s_file_in_a_step_folder(tmp_path_factory, trained, step, name, body, real):
    root = tmp_path_factory.mktemp("ud")
    d = root / "ud"
    if real:
        shutil.copytree(trained, d)
    keep = d / f"step-{step:08d}" / name
    keep.parent.mkdir(parents=True, exist_ok=True)
    keep.write_bytes(body)
    before = _tree(root)
    refused("train", "--model", "attention", "--steps", "3", "--batch-size", "4", "--out", d,
            says=("--out", str(keep.parent)))
    assert _tree(root) == before


def test_a_forced_run_still_removes_only_its_own_step_folders(run_copy):
    keep = run_copy / "step-00000001" / "notes.txt"
    keep.parent.mkdir()
    keep.write_text("keep me")
    code, out = run("train", "--model", "attention", "--steps", "3", "--batch-size", "4", "--eval-every", "3",
                    "--checkpoint-every", "3", "--model-opt", "d_model=16", "--model-opt", "n_layers=1",
                    "--model-opt", "n_heads=2", "--model-opt", "head_dim=8", "--model-opt", "d_ff=16",
                    "--out", run_copy, "--force", "--json")
    assert code == 0, out
    assert keep.read_text() == "keep me"
    assert (run_copy / "step-00000003").is_dir() and not (run_copy / "step-00000002").exists()


@FAST
@given(where=st.sampled_from(["inside", "itself", "parent", "step"]), name=NAMES)
def test_export_is_never_written_inside_its_run(tmp_path_factory, trained, where, name):
    root = tmp_path_factory.mktemp("ex")
    d = root / "run"
    shutil.copytree(trained, d)
    out = {"inside": d / name, "itself": d, "parent": root, "step": d / "step-00000003"}[where]
    before = _tree(root)
    refused("export", d, out, says=("OUT", str(out)))
    assert _tree(root) == before


def test_save_and_probe_are_never_written_inside_their_input(tmp_path, trained):
    from storelab.checkpoint import save
    from storelab.models.model import Model
    from storelab.train.models import resolve_model

    src = tmp_path / "saved"
    save(Model(resolve_model("attention", 32, d_model=16, n_layers=1, n_heads=2, head_dim=8, d_ff=16)), src)
    before = _tree(tmp_path)
    refused("save", src, src / "converted", "--checkpoint", says=("OUT", "input"))
    refused("probe", "state_swap", "--checkpoint", src, "--out", src / "probes", says=("--out", "input"))
    assert _tree(tmp_path) == before


# -- 3. a damaged run folder ---------------------------------------------------------------------------
RESUME = ("--model", "attention", "--steps", "3", "--batch-size", "4", "--eval-every", "2", "--checkpoint-every", "2",
          *[a for o in ("d_model=16", "n_layers=1", "n_heads=2", "head_dim=8", "d_ff=16") for a in ("--model-opt", o)])
WRONG = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**9), st.floats(allow_nan=False), st.text(max_size=8),
                  st.lists(st.integers(0, 3), max_size=3),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
FIELD_TYPES = {"format": str, "step": int, "folder": str, "train_config": dict, "model_config": dict, "task": dict,
               "world": int, "parallel": str, "schedule": list, "history": list}


def _pointer(d: Path) -> dict:
    return json.loads((d / "checkpoint.json").read_text())


def _set_pointer(d: Path, meta: dict) -> None:
    (d / "checkpoint.json").write_text(json.dumps(meta))


def _damaged_refused(root: Path, d: Path, names: tuple[str, ...]) -> None:
    before = _tree(root)
    for args in (("export", d, root / "model"), ("train", *RESUME, "--out", d)):
        out = refused(*args, says=(str(d),))
        assert any(n in out for n in names), f"{args}: none of {names} named:\n{out}"
        assert _tree(root) == before and not (root / "model").exists()


@FAST
@given(field=st.sampled_from(sorted(FIELD_TYPES)), value=WRONG)
def test_a_pointer_field_of_the_wrong_type_is_named(tmp_path_factory, trained, field, value):
    if isinstance(value, FIELD_TYPES[field]) and not isinstance(value, bool):
        value = [value]  # of the right type by chance: wrap it in a list, which no field of these types is
        if FIELD_TYPES[field] is list:
            value = {"x": 1}
    root = tmp_path_factory.mktemp("ptr")
    d = root / "run"
    shutil.copytree(trained, d)
    _set_pointer(d, {**_pointer(d), field: value})
    _damaged_refused(root, d, ("checkpoint.json",))


@FAST
@given(folder=st.sampled_from(["../../etc", "/etc", "step-00000002/../../x", "..", "step-00000001", "",
                               "step-00000002/"]))
def test_the_step_folder_pointer_is_never_followed_out_of_the_run(tmp_path_factory, trained, folder):
    root = tmp_path_factory.mktemp("out")
    d = root / "run"
    shutil.copytree(trained, d)
    _set_pointer(d, {**_pointer(d), "folder": folder})
    _damaged_refused(root, d, ("checkpoint.json", "folder"))


@FAST
@given(where=st.sampled_from(["train_config", "model_config", "task", "schedule", "history"]),
       key=st.sampled_from(["steps", "d_model", "name", "lr", "mix", "from", "vocab_size", "nonsense"]), value=WRONG)
def test_a_nested_field_of_the_wrong_type_or_shape_is_named(tmp_path_factory, trained, where, key, value):
    from storelab.train.checkpoint import check_pointer

    root = tmp_path_factory.mktemp("nest")
    d = root / "run"
    shutil.copytree(trained, d)
    meta = _pointer(d)
    if isinstance(meta[where], list):
        meta[where] = [{**meta[where][0], key: value}] if where == "schedule" else [value]
    else:
        meta[where] = {**meta[where], key: value}
    _set_pointer(d, meta)
    try:
        check_pointer(meta, d / "checkpoint.json")
    except ValueError:
        pass
    else:
        return  # a value that happens to be valid (history holds any object; lr=3 is a rate): nothing to refuse
    _damaged_refused(root, d, ("checkpoint.json",))


@FAST
@given(damage=st.sampled_from(["no step folder", "no .metadata", "truncated shard", "truncated .metadata",
                               "wider model", "pointer cut", "step folder a file"]),
       keep=st.floats(0, 0.99))
def test_a_damaged_step_folder_is_refused_naming_it(tmp_path_factory, trained, damage, keep):
    root = tmp_path_factory.mktemp("dmg")
    d = root / "run"
    shutil.copytree(trained, d)
    step = d / "step-00000002"
    shard = next(step.glob("*.distcp"))
    if damage == "no step folder":
        shutil.rmtree(step)
    elif damage == "step folder a file":
        shutil.rmtree(step)
        step.write_text("not a folder")
    elif damage == "no .metadata":
        (step / ".metadata").unlink()
    elif damage.startswith("truncated"):
        f = shard if damage == "truncated shard" else step / ".metadata"
        f.write_bytes(f.read_bytes()[:int(keep * f.stat().st_size)])
    elif damage == "wider model":
        meta = _pointer(d)
        meta["model_config"]["d_model"] = 32  # the tensors no longer fit the model it describes
        _set_pointer(d, meta)
    else:
        text = (d / "checkpoint.json").read_text()
        (d / "checkpoint.json").write_text(text[:int(keep * len(text))])
    if damage == "wider model":  # resuming rebuilds the model from --model: only export reads model_config
        before = _tree(root)
        refused("export", d, root / "model", says=(str(step), "model.embed.weight"))
        assert _tree(root) == before
        return
    _damaged_refused(root, d, ("step-00000002", "checkpoint.json"))


# -- 5. non-finite weights or activations -------------------------------------------------------------
@pytest.fixture(scope="module")
def small_save(tmp_path_factory) -> Path:
    from storelab.checkpoint import save
    from storelab.models.model import Model
    from storelab.zoo import load_zoo

    d = tmp_path_factory.mktemp("small") / "saved"
    save(Model(load_zoo("kimi-k3", tiny=True)), d)
    return d


@FAST
@given(which=st.integers(0, 10**6), value=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
       share=st.floats(0.0, 1.0), command=st.sampled_from(["generate", "probe"]))
def test_non_finite_weights_are_an_error_naming_the_tensor(tmp_path_factory, small_save, which, value, share,
                                                           command):
    import torch

    from storelab.checkpoint import load, save

    root = tmp_path_factory.mktemp("nan")
    model = load(small_save)
    named = [(n, p) for n, p in model.named_parameters() if p.numel()]
    name, p = named[which % len(named)]
    with torch.no_grad():
        flat = p.view(-1)
        flat[:max(1, int(share * flat.numel()))] = value
    d = root / "nan"
    save(model, d)
    before = _tree(root)
    args = (("generate", "--checkpoint", d, "--new-tokens", "2", "--prompt-len", "4") if command == "generate" else
            ("probe", "forgetting", "--checkpoint", d, "--task", "mqar", "--n", "2"))
    refused(*args, says=("weights", repr(name), str(d)))
    assert _tree(root) == before


@FAST
@given(result=st.recursive(st.floats(allow_nan=True, allow_infinity=True) | st.integers() | st.text(max_size=3),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text("abc", max_size=3), kids,
                                                                                     max_size=3), max_leaves=12))
def test_every_non_finite_figure_of_a_probe_result_is_found(result):
    import math

    from storelab.commands._finite import invalid_fields

    def leaves(x):
        if isinstance(x, dict):
            return [v for k, y in x.items() if k != "essay" for v in leaves(y)]
        return [v for y in x for v in leaves(y)] if isinstance(x, list) else [x]

    bad = [v for v in leaves(result) if isinstance(v, float) and not math.isfinite(v)]
    assert len(invalid_fields(result)) == len(bad)


def test_non_finite_logits_while_generating_are_an_error():
    import torch

    from storelab.commands._finite import check_logits

    check_logits(torch.zeros(1, 4), "token 3")
    with pytest.raises(ValueError, match="activations: the logits at token 3"):
        check_logits(torch.tensor([[0.0, float("nan")]]), "token 3")


# -- 4. sizes the user gives ----------------------------------------------------------------------------
@pytest.fixture
def small_machine(monkeypatch):
    """A machine of 64 MiB, so that the refusals do not depend on the one the tests run on."""
    import storelab.models.config as config

    monkeypatch.setattr(config, "machine_bytes", lambda: 64 << 20)


@FAST
@given(contexts=st.lists(st.integers(10**6, 10**12), min_size=1, max_size=3),
       model=st.sampled_from(["tiny-deepseek-v4.1-flash", "tiny-glm-5.3"]))
def test_probe_contexts_beyond_the_machine_are_refused_before_the_run(small_machine, contexts, model):
    out = refused("probe", "selection", "--model", model, "--contexts", ",".join(map(str, contexts)),
                  says=("--contexts", f"{max(contexts):,} tokens", "GiB"))
    assert "Traceback" not in out


@FAST
@given(prompt=st.integers(10**6, 2**24), new=st.integers(0, 2**24), chunk=st.integers(0, 4096))
def test_generate_sizes_beyond_the_machine_are_refused_before_the_run(small_machine, prompt, new, chunk):
    refused("generate", "kimi-k3", "--tiny", "--prompt-len", prompt, "--new-tokens", new, "--chunk", chunk,
            says=("--prompt-len", "--new-tokens", f"{prompt + new:,} tokens"))


@FAST
@given(tokens=st.integers(1, 10**9), more=st.integers(1, 10**9), batch=st.integers(1, 64),
       chunk=st.integers(1, 10**6))
def test_run_bytes_grow_with_every_size(tokens, more, batch, chunk):
    from storelab.models.memory_terms import run_bytes
    from storelab.zoo import load_zoo

    cfg = load_zoo("kimi-k3", tiny=True)
    at = run_bytes(cfg, tokens=tokens, batch=batch, chunk=chunk)
    assert run_bytes(cfg, tokens=tokens + more, batch=batch, chunk=chunk) > at
    assert run_bytes(cfg, tokens=tokens, batch=batch + 1, chunk=chunk) > at
    assert run_bytes(cfg, tokens=tokens, batch=batch, chunk=None) >= at


# -- 6. output a user misreads (the memory JSON: tests/test_memory_schema.py) ---------------------------
@FAST
@given(top_k=st.integers(1, 10**6), extra=st.sampled_from([(), ("--temperature", "0"), ("--temperature", "0.0")]))
def test_top_k_with_greedy_decoding_is_an_error(top_k, extra):
    refused("generate", "kimi-k3", "--tiny", "--top-k", top_k, *extra, says=("--top-k", "--temperature"))


@FAST
@given(command=st.sampled_from(["memory", "models", "generate", "save"]),
       source=st.sampled_from(["config", "checkpoint"]))
def test_tiny_with_a_file_or_a_checkpoint_is_an_error(tmp_path_factory, small_save, command, source):
    root = tmp_path_factory.mktemp("tiny")
    model_file = root / "m.toml"
    model_file.write_text(BASE.format(n=2))
    before = _tree(root)
    where = small_save if source == "checkpoint" else model_file
    if command == "save":
        args = ("save", where, root / "out", f"--{source}", "--tiny")
    else:
        args = (command, f"--{source}", where, "--tiny")
    refused(*args, says=("--tiny", f"--{source}"))
    assert _tree(root) == before and not (root / "out").exists()


@FAST
@given(n=st.integers(2, 100), data=st.data())
def test_layer_lists_say_only_what_holds(n, data):
    from storelab.report.memory_text import layers_text

    idx = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
    text = layers_text(idx, n)
    count, body = text.split(": ", 1)
    assert count == f"{len(idx)} of {n}"
    if "and the last" in body:
        assert idx[-1] == n - 1
    if body == "all":
        assert idx == list(range(n))
    if body.startswith("all and the last"):
        assert idx == list(range(n))
    assert layers_text([0, 1, 2], 4) != "3 of 4: all and the last"


@FAST
@given(n=st.integers(0, 10**13))
def test_parameter_counts_are_never_shown_as_zero(n):
    from storelab.report.memory_text import params_text

    text = params_text(n)
    assert (text != "0" if n else text == "0") and not text.startswith("0.00")


def test_save_export_train_and_models_count_parameters_the_same(trained, tmp_path):
    from storelab.models.accounting import count_params
    from storelab.train.loop import load_trained

    code, out = run("models", "kimi-k3", "--tiny", "--json")
    (rec,) = json.loads(out)
    code, out = run("save", "kimi-k3", tmp_path / "s", "--tiny", "--json")
    assert code == 0 and json.loads(out)["parameters"] == rec["params"]["stored"]
    code, out = run("export", trained, tmp_path / "e", "--json")
    model, _, _ = load_trained(trained)
    assert code == 0 and json.loads(out)["parameters"] == count_params(model.cfg).stored


def test_the_selection_probe_names_every_kind_that_selects():
    from storelab.stores.base import REGISTRY

    out = refused("probe", "selection", "--model", "tiny-kimi-k3", "--n", "2", says=("selection layer",))
    for kind in (k for k, c in REGISTRY.items() if c.SELECTS):
        assert kind in out, kind
    assert "csa" in out


@FAST
@given(name=st.sampled_from(["checkpoint.json", "config.json", "step-00000002"]),
       how=st.sampled_from(["link", "folder"]))
def test_a_run_s_pointer_or_step_folder_replaced_by_a_link_or_a_folder_is_refused(tmp_path_factory, trained, name,
                                                                                   how):
    root = tmp_path_factory.mktemp("link")
    d = root / "run"
    shutil.copytree(trained, d)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep me")
    target = d / name
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    if how == "link":
        target.symlink_to(elsewhere, target_is_directory=True)
    else:
        target.mkdir()
        (target / "mine.txt").write_text("mine")
    before = _tree(root)
    out = refused("train", *RESUME, "--out", d, says=(str(d),))
    assert name in out
    assert _tree(root) == before and (elsewhere / "keep.txt").read_text() == "keep me"


@FAST
@given(seq_len=st.integers(10**5, 10**9), width=st.integers(1, 1024).map(lambda x: 4 * x),
       vocab=st.integers(64, 10**6))
def test_recall_sizes_beyond_the_machine_are_refused_before_training(tmp_path_factory, small_machine, seq_len, width,
                                                                      vocab):
    out = tmp_path_factory.mktemp("recall") / "r"
    refused("recall", "--seq-len", seq_len, "--widths", width, "--vocab", vocab, "--pairs", "4", "--steps", "1",
            "--models", "attention", "--out", out, says=("--seq-len", "--widths", "--vocab"))
    assert not out.exists()
