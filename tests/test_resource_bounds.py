"""Resource options held against the machine before the work (issue 38, item 7): threads and processes at
most the machine's cores, list options at most ``MAX_LIST`` values; exit 2 naming the option."""

from __future__ import annotations

import os

import pytest

from storelab.options import MAX_LIST
from tests.test_bad_inputs import refused, wide_console  # noqa: F401 (an autouse fixture)

TOO_MANY = (os.cpu_count() or 1) + 1


@pytest.mark.parametrize("args, option", [
    (("train", "--model", "attention", "--steps", "1", "--threads", 1000), "--threads"),
    (("train", "--model", "attention", "--steps", "1", "--threads", TOO_MANY), "--threads"),
    (("subjects", "train", "--all", "--jobs", 1000), "--jobs"),
    (("probe", "selection", "--model", "tiny-kimi-k3", "--contexts", ",".join(str(8 + i) for i in range(3000))),
     "--contexts"),
    (("recall", "--models", "attention", "--widths", ",".join(str(16 + i) for i in range(MAX_LIST + 1))), "--widths"),
])
def test_resource_options_beyond_the_machine_are_refused(tmp_path, args, option):
    refused(*args, "--json", says=(option,))


def test_train_api_refuses_more_threads_than_cores(tmp_path):
    from storelab.train.loop import TrainConfig, train

    with pytest.raises(ValueError, match=r"threads: .* more than this machine's \d+ cores"):
        train(TrainConfig(model="attention", steps=1, threads=TOO_MANY), None)
