"""Training small models on the synthetic tasks: the loop, checkpoints, DDP / FSDP2, benchmarks.

* ``train(TrainConfig(...), out=DIR)`` - AdamW, warm-up + cosine, clipping, seeded, DCP checkpoints,
  resume on any world size; under torchrun with DDP or FSDP2 (``storelab.train.distributed``),
  bf16 mixed precision, gradient accumulation;
* ``load_trained(DIR)`` - (model, task, metadata) of a run directory, in one process;
* ``train_dictionary_hybrid(seconds_budget, seed)`` - (model, metrics): a tiny 3:1 hybrid on the
  dictionary-and-language task, within a time budget; ``dictionary_task()`` is its task;
* ``storelab.train.recall`` - the recall benchmark (accuracy against state size).
"""

from storelab.train.budget import dictionary_task, train_dictionary_hybrid, train_for
from storelab.train.loop import TrainConfig, TrainResult, evaluate, load_trained, lr_at, train

__all__ = ["TrainConfig", "TrainResult", "evaluate", "load_trained", "lr_at", "train", "train_for",
           "train_dictionary_hybrid", "dictionary_task"]
