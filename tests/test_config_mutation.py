"""Every numeric field of every family's config, mistyped or out of range, is read or refused by name.

For each published config in ``tests/fixtures/configs`` and, for a family ``model_type`` no fixture has,
transformers' own default config of that type (``AutoConfig.for_model(model_type).to_dict()``), every
numeric field, at the top and nested (``text_config``, ``linear_attn_config``, ``rope_parameters``,
``quantization_config``, ``vision_config`` ...), is set in turn to ``"x"``, ``0``, ``-4`` and ``1e12``
and the file read with ``read_model_config`` (header-only: milliseconds a config). The answer must be a
ModelConfig, or a ``CheckpointError`` (a ValueError) whose message names the file and the mutated field:
never a TypeError, a ZeroDivisionError, or an error that names a storelab field (``norm_eps``) in place of
the config's (``rms_norm_eps``). A config refused as published (Gemma 4) may be refused for any reason
that names the file.

A field is mutated once per family: the same field of a second config of one family reads through the
same code.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from storelab.checkpoint import CheckpointError, read_model_config
from storelab.checkpoint.families import FAMILIES, family_for

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
VALUES = ("x", 0, -4, 1e12)
NOT_A_FAMILY = ("storelab", "unread")  # storelab's own configs; the list of model types it refuses by name


def numeric_paths(d: dict, path: tuple = ()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from numeric_paths(v, path + (k,))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield path + (k,)


def sources() -> dict[str, list[tuple[str, dict]]]:
    """family name -> [(where the config comes from, the config)]: the fixtures, then transformers' default
    config of each model type of the family no fixture has."""
    out: dict[str, list[tuple[str, dict]]] = {}
    seen_types = set()
    for f in sorted(FIXTURES.glob("*.json")):
        hf = json.loads(f.read_text())
        seen_types.add(hf.get("model_type"))
        out.setdefault(family_for(hf).name, []).append((f.name, hf))
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for fam in FAMILIES:
        if fam.name in NOT_A_FAMILY:
            continue
        for mt in fam.model_types:
            if mt not in seen_types and mt in CONFIG_MAPPING:
                out.setdefault(fam.name, []).append((f"transformers {mt}", AutoConfig.for_model(mt).to_dict()))
    return out


SOURCES = sources()


def _read(path: Path) -> str | None:
    """None when the config reads; the refusal's message otherwise (any other exception propagates)."""
    try:
        read_model_config(path)
    except CheckpointError as e:
        return str(e)
    return None


def mutation_failures(family: str, tmp: Path) -> tuple[int, int, list[str]]:
    """(fields, mutations, failures) of one family's configs."""
    path = tmp / "config.json"
    done, failures, n = set(), [], 0
    for name, hf in SOURCES[family]:
        path.write_text(json.dumps(hf))
        baseline = _read(path)
        for p in numeric_paths(hf):
            if p in done:
                continue
            done.add(p)
            for value in VALUES:
                h = copy.deepcopy(hf)
                d = h
                for k in p[:-1]:
                    d = d[k]
                d[p[-1]] = value
                path.write_text(json.dumps(h))
                n += 1
                field = ".".join(map(str, p))
                try:
                    msg = _read(path)
                except Exception as e:  # noqa: BLE001 - what the test looks for
                    failures.append(f"{name}: {field} = {value!r}: {type(e).__name__}: {e}")
                    continue
                if msg is None or (baseline is not None and str(path) in msg):
                    continue  # read; or a config refused as published, refused again
                if str(path) not in msg or str(p[-1]) not in msg:
                    failures.append(f"{name}: {field} = {value!r}: does not name the file and field: {msg}")
    return len(done), n, failures


@pytest.mark.parametrize("family", sorted(SOURCES))
def test_every_numeric_field_read_or_refused_by_name(family, tmp_path):
    fields, n, failures = mutation_failures(family, tmp_path)
    assert fields, f"{family}: no numeric field to mutate"
    assert not failures, f"{family}: {len(failures)} of {n} mutations:\n" + "\n".join(failures[:30])


def test_every_family_is_covered():
    """Every family that reads configs has a config here (a fixture or transformers' default)."""
    missing = [f.name for f in FAMILIES if f.name not in NOT_A_FAMILY and f.name not in SOURCES]
    assert not missing, f"families without a config to mutate: {missing}"
