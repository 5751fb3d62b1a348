"""``storelab report --checkpoint DIR``: the essay's trained-model claims measured on a model folder."""

import json

import pytest
from typer.testing import CliRunner

from storelab.cli import app
from storelab.report import build_report
from tests.helpers import write_tokenizer
from tests.test_checkpoint import tiny_hf
from tests.test_probe_text import VOCAB, corpus


@pytest.fixture(scope="module")
def kimi_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("kimi_linear")
    tiny_hf("kimi_linear", vocab_size=VOCAB).save_pretrained(d)
    write_tokenizer(d, corpus(), vocab=VOCAB)
    return d


@pytest.mark.parametrize("stream", [False, True])
def test_the_checkpoint_section_measures_the_trained_model_claims(kimi_folder, tmp_path, stream):
    from storelab.report.build import checkpoint_section_of

    paths, outcomes = build_report(tmp_path / "r", quick=True, sections=[checkpoint_section_of(kimi_folder)],
                                   checkpoint=kimi_folder, stream=stream)
    (oc,) = outcomes
    assert oc.ok, oc.error
    claims = [c for c in oc.result.claims if c.section.startswith("checkpoint:")]
    by_claim = {c.claim: c for c in claims}
    assert len(claims) == 8
    # kimi_linear has KDA and MLA layers, so the swap, keep-one and both forgetting figures apply; but this
    # checkpoint is untrained: its answers are at chance, so none is measured, each with the check's reason
    for key in ("state swap moves", "states carry almost none", "caches alone", "states alone", "median half-life",
                "KDA heads mix"):
        (c,) = [c for k, c in by_claim.items() if key in k]
        assert c.status == "not measured" and c.measured is None, (key, c)
        assert c.reason.startswith("not measured: model did not learn (") and "chance" in c.reason, c.reason
    assert "No probe found an effect to measure on this model" in oc.result.text
    swap_rows = oc.result.tables[0].rows
    assert swap_rows[0][0] == "check" and "not learned" in swap_rows[0][1]
    assert "not learned" in [r[1] for r in swap_rows]
    # ... mHC's are not (no mHC in this family), with the reason
    for c in claims:
        if "mHC" in c.claim or "second half" in c.claim:
            assert c.status == "not checkable" and "mhc did not run" in c.reason and "mHC" in c.reason
    doc = json.loads(paths["json"].read_text())
    assert any(c["section"].startswith("checkpoint:") for c in doc["ledger"])
    assert "not learned" in doc["sections"][0]["data"]["results"]["state_swap"]["reason"]
    assert "6 not measured" in paths["md"].read_text() and 'class="not-measured"' in paths["html"].read_text()
    assert oc.result.data["weights_only"]["read"]["bytes_read"] > 0


def test_report_checkpoint_errors(tmp_path, kimi_folder):
    import shutil

    runner = CliRunner()
    for args, msg in ((["--checkpoint", str(tmp_path / "nowhere")], "does not exist"),
                      (["--stream"], "--stream reads the model folder")):
        res = runner.invoke(app, ["report", "--out", str(tmp_path / "r"), *args], env={"COLUMNS": "300"})
        assert res.exit_code == 2 and msg in res.output, res.output
    bare = tmp_path / "bare"
    shutil.copytree(kimi_folder, bare)
    (bare / "tokenizer.json").unlink()
    res = runner.invoke(app, ["report", "--out", str(tmp_path / "r"), "--checkpoint", str(bare)], env={"COLUMNS": "300"})
    assert res.exit_code == 2 and "tokenizer.json: missing" in res.output, res.output
    assert not (tmp_path / "r").exists()   # refused before any section ran or wrote


@pytest.mark.parametrize("model_type", ["mamba2", "nemotron_h"])
def test_the_checkpoint_section_on_mamba2_layers_keeps_its_weights_only_part(model_type, tmp_path):
    """Issue 38: the weights-only forgetting estimate asked Mamba-2 for a rule and the section was lost; the
    store now declares what its gate reads (``gate_params``)."""
    from storelab.report.build import checkpoint_section_of
    from tests.family_harness import tiny_hf as tiny_family
    from tests.test_family_mamba import TINY

    d = tmp_path / model_type
    tiny_family(model_type, dict(TINY[model_type], vocab_size=VOCAB), perturb=0.1).save_pretrained(d)
    write_tokenizer(d, corpus(), vocab=VOCAB)
    _, outcomes = build_report(tmp_path / "r", quick=True, sections=[checkpoint_section_of(d)], checkpoint=d)
    (oc,) = outcomes
    assert oc.ok, oc.error
    w = oc.result.data["weights_only"]
    assert w["layers"] and all(lay["decay"] == "per head" for lay in w["layers"])
