"""The document probes on tiny transformers checkpoints (glm_moe_dsa: DSA + IndexShare; deepseek_v4:
CSA/HCA + mHC), text through the folder's tokenizer; mHC ablations on documents.

Closed forms: a model whose mHC mix is already the identity (or constant) loses nothing when it is
replaced by the identity (or its token average); perplexity = exp(mean next-token NLL), checked against
the logits directly. The models are untrained, so the mHC probe's check would withhold its changes;
the tests that read them pass it by fiat (``unchecked``; the check: ``tests/test_probe_validity.py``).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from storelab.checkpoint import load
from storelab.models.model import Model
from storelab.probes import mhc_documents, selection_sweep
from storelab.probes.common import document_inputs
from storelab.probes.mhc import mhc_mixers
from storelab.probes.selection_sweep import layer_scores
from storelab.stores.base import observe
from storelab.stores.selection_scores import selected
from storelab.text import Tokenizer
from storelab.train.models import resolve_model
from tests.helpers import write_tokenizer
from tests.test_checkpoint import tiny_hf
from tests.test_probes import unchecked  # noqa: F401  (a fixture)

TEXTS = ["The river rose in the night and the town woke to water in the streets.",
         "A ledger lists every sale: three apples on Monday, five pears on Tuesday, none on Wednesday.",
         "Stores keep what a model reads; an indexer chooses which of them a query may see."]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """model_type -> a saved tiny checkpoint with a tokenizer, and its text documents as token ids."""
    made = {}

    def get(model_type: str):
        if model_type not in made:
            d = tmp_path_factory.mktemp(model_type)
            tiny_hf(model_type, vocab_size=512).save_pretrained(d)
            write_tokenizer(d, " ".join(TEXTS * 4), vocab=400)
            tok = Tokenizer.from_folder(d)
            made[model_type] = (load(d).eval(), [tok.encode(t) for t in TEXTS])
        return made[model_type]
    return get


def test_glm_checkpoint_indexshare_sweep(folder):
    m, docs = folder("glm_moe_dsa")
    ids = document_inputs(docs, 64)
    sc = layer_scores(m, ids, queries=6, chunk=16)
    shared = [i for i, s in sc.items() if not s.own_indexer]
    assert shared and all(m.cfg.layers[i].selection_owner is not None for i in shared)
    with torch.no_grad(), observe(*(m.blocks[i].token for i in sc)) as seen:
        m(ids)
    for i, s in sc.items():  # the protocol's selection is the forward's, shared layers too
        want = torch.zeros_like(s.candidate_BGQN[:, 0])
        want.scatter_(-1, seen.last(m.blocks[i].token, "selection")[:, -6:], True)
        assert torch.equal(selected(s, s.k)[:, 0], want), f"layer {i}"
    r = selection_sweep(m, docs, contexts=(32, 64), topk=(1, 2), queries=6)
    row = next(x for x in r["layers"] if not x["own_indexer"])
    cost = row["points"][0]["sharing_cost"]
    assert 0.0 <= cost["owner_recall"] <= 1.0 and cost["mass_missed"] >= -1e-6


def _identity_mix(model, *, identity: bool) -> None:
    for half in ("first", "second"):
        for mixer in mhc_mixers(model, half):
            N = mixer.cfg.n_streams
            with torch.no_grad():
                mixer.weight[2 * N:].zero_()         # B no longer depends on the token
                mixer.bias[2 * N:] = (30 * torch.eye(N) if identity else 3 * torch.randn(N, N)).flatten()


def test_deepseek_v4_checkpoint_csa_and_mhc_on_text(folder, unchecked):
    m, docs = folder("deepseek_v4")
    r = selection_sweep(m, docs, contexts=(48,), queries=4)
    assert r["layers"] and {x["kind"] for x in r["layers"]} == {"csa"}
    base = mhc_documents(m, docs, context=24, n=2)
    rows = document_inputs(docs, 25, 2)
    with torch.no_grad():
        logits, _ = m(rows[:, :-1])
    nll = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten()).item()
    assert base["base_perplexity"] == pytest.approx(math.exp(nll), rel=1e-5)
    assert set(base["conditions"]) == {f"{c}_{h}_half" for c in ("identity", "average") for h in ("first", "second")}
    _identity_mix(m, identity=True)
    for cond in mhc_documents(m, docs, context=24, n=2)["conditions"].values():
        assert abs(cond["perplexity_change"]) < 1e-5 and cond["perplexity"] > 1


def test_mhc_documents_constant_mix_average_is_free_identity_is_not(unchecked):
    torch.manual_seed(0)
    m = Model(resolve_model("tiny-deepseek-v4-pro", 256)).eval()
    _identity_mix(m, identity=False)
    docs = [torch.randint(0, 256, (n,)).tolist() for n in (30, 41)]
    c = mhc_documents(m, docs, context=32, n=2)["conditions"]
    assert abs(c["average_first_half"]["perplexity_change"]) < 1e-5
    assert abs(c["average_second_half"]["perplexity_change"]) < 1e-5
    assert abs(c["identity_first_half"]["perplexity_change"]) > 1e-4
    with pytest.raises(ValueError, match="context"):
        mhc_documents(m, docs, context=1)
    with pytest.raises(ValueError, match="documents"):
        mhc_documents(m, [[]], context=8)
