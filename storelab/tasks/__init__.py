"""Synthetic tasks: seeded generators of token sequences with next-token targets.

* ``mqar``            - multi-query associative recall (Zoology, arXiv 2312.04927);
* ``dictionary``      - a dictionary answered in a requested "language" (content vs settings);
* ``parity``          - running parity (state tracking);
* ``selective_copy``  - copy the scattered data tokens in order (Mamba, arXiv 2312.00752).

``make_task(name, **options)`` builds one; ``task.sample(n, seed)`` gives a ``Batch``.
"""

from storelab.tasks.base import IGNORE, TASKS, Batch, accuracy, batch_seed, make_task, task_dict
from storelab.tasks.dictionary import DictionaryLanguage, tiny_dictionary
from storelab.tasks.mqar import MQAR, MQAR_TEST_MIX, MQAR_TRAIN_MIX, tiny_mqar
from storelab.tasks.state_tracking import Parity, SelectiveCopy

__all__ = ["IGNORE", "TASKS", "Batch", "accuracy", "batch_seed", "make_task", "task_dict", "MQAR", "MQAR_TRAIN_MIX",
           "MQAR_TEST_MIX", "tiny_mqar", "DictionaryLanguage", "tiny_dictionary", "Parity", "SelectiveCopy"]
