"""SmolLM3 (Hugging Face, 2025): a Llama decoder in which every ``no_rope_layer_interval``-th layer
(4) attends with no positions at all (NoPE; ``no_rope_layers`` lists 1 for a rotating layer, 0 for
one without), which our attention says as ``partial_rotary = 0``.
"""

from storelab.checkpoint.families._reader import Decl, family

FAMILY = family(Decl(name="smollm3", model_types=("smollm3",), title="SmolLM3 (checkpoint)", nope=True))
