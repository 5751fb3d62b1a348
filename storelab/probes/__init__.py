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
"""

from storelab.probes.forgetting import forgetting
from storelab.probes.mhc import mhc_ablation
from storelab.probes.selection import selection
from storelab.probes.swap import keep_one, state_swap

PROBES = {"state_swap": state_swap, "keep_one": keep_one, "forgetting": forgetting, "mhc": mhc_ablation,
          "selection": selection}

__all__ = ["PROBES", "state_swap", "keep_one", "forgetting", "mhc_ablation", "selection"]
