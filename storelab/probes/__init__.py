"""Probes: what a trained hybrid keeps in each of its stores (essay section 3, "What the trained
hybrids do with their stores", and section 4 for mHC).

Each probe is a function ``probe(model, task, **options) -> dict`` that works on any storelab
``Model`` (trained here, or built from a checkpoint) and returns its figures, with the essay's
figures for the large models under ``"essay"`` as context, not as targets.

=============  ===========================================================  ==========================
name           what it measures                                             source
=============  ===========================================================  ==========================
state_swap     fraction of an answer's shift moved by patching all          Lee et al., 2609.33093
               recurrent states vs all attention caches
keep_one       retrieval / language compliance with only the cache or      Afendulev et al., 2609.04434
               only the state; a paired swap of cache and state
forgetting     recurrent heads' half-lives from their decay gates;         GateSight 2610.14754;
               KDA heads mixing fast and slow channels (weights only)      DASC 2608.30386
mhc            loss change when mHC's mix is the identity or its average   Zhao et al., 2609.05309
               over tokens, in the first or second half of the layers
selection      indexer miss rate; how often it selects the first block     MSA 2606.13392
=============  ===========================================================  ==========================

Before a probe reports a fraction of an effect it checks that there is one (``validity``: the
model answers above chance by ``MARGIN``; a swap's donor moves the answer by ``MIN_SHIFT``). Where
the check fails the fractions are None and the result's ``valid``, ``reason`` and ``validity`` say
why ("not learned: answer accuracy 0.012 vs chance 0.012 (needs >= chance + 0.2)").

On documents (token ids; ``DOCUMENT_PROBES``, ``probe(model, documents, **options)``):
``selection_sweep`` (recall of the exact top-k and attention mass missed per selecting layer, against
context length and top-k; IndexShare's cost) and ``mhc_documents`` (perplexity change of the mHC
ablations over the documents).
"""

from storelab.probes.forgetting import forgetting
from storelab.probes.mhc import mhc_ablation, mhc_documents
from storelab.probes.selection import selection
from storelab.probes.selection_sweep import selection_sweep
from storelab.probes.swap import keep_one, state_swap
from storelab.probes.validity import Validity

PROBES = {"state_swap": state_swap, "keep_one": keep_one, "forgetting": forgetting, "mhc": mhc_ablation,
          "selection": selection}


def _sweep(model, documents, *, contexts, topk=(1,), queries=64, n=1):
    from storelab.models import peaks
    from storelab.models.memory_terms import run_bytes

    if contexts and min(contexts) >= 1 and documents:   # the peak first, measured (selection_sweep checks the rest)
        C = max(contexts)
        peaks.gate(model, run_bytes(model.cfg, tokens=C, chunk=1024),
                   lambda: peaks.fitted_tensors(lambda x: selection_sweep(model, documents, contexts=(x,), topk=tuple(topk),
                                                                         queries=queries), (1024, 2048, 3072), C),
                   option="--contexts", held=f"a selection sweep to {C:,} tokens", instead="give shorter contexts",
                   large=C > 3 * 1024)
    return selection_sweep(model, documents, contexts=contexts, topk=topk, queries=queries)


def _mhc_docs(model, documents, *, contexts, topk=(1,), queries=64, n=8):  # topk, queries: selection's
    from storelab.models import peaks
    from storelab.models.memory_terms import run_bytes

    C = contexts[0]
    if C >= 2 and n >= 1 and documents:   # n rows of C tokens scored in one call, six times
        peaks.gate(model, run_bytes(model.cfg, tokens=C + 1, batch=n),
                   lambda: peaks.fitted_tensors(lambda x: mhc_documents(model, documents, context=x, n=n),
                                                peaks.MHC_CONTEXTS, C),
                   option="--contexts", held=f"{n:,} rows of {C:,} tokens",
                   instead="give a shorter first context (or fewer rows, --n)", large=C > peaks.MHC_CONTEXTS[-1])
    return mhc_documents(model, documents, context=C, n=n)


# the probes that take documents (``storelab probe NAME --contexts ...``)
DOCUMENT_PROBES = {"selection": _sweep, "mhc": _mhc_docs}

__all__ = ["PROBES", "DOCUMENT_PROBES", "state_swap", "keep_one", "forgetting", "mhc_ablation", "mhc_documents",
           "selection", "selection_sweep", "Validity"]
