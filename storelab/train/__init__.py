"""Training small models on the synthetic tasks: the loop, checkpoints, data parallelism, benchmarks."""

from storelab.train.loop import TrainConfig, TrainResult, evaluate, load_trained, lr_at, train

__all__ = ["TrainConfig", "TrainResult", "evaluate", "load_trained", "lr_at", "train"]
