"""An fp32 copy of a GGUF file, so that every engine of ``storelab bench engines --f32`` multiplies by the same
fp32 weights (llama.cpp runs a file's weights in their own format; storelab and transformers dequantize them).

``f32_copy(src)`` writes, once, ``~/.cache/storelab/bench/<name>.<sha256 of the first MiB and size>.f32.gguf``:
every metadata field copied as it is (``general.file_type`` set to 0, all fp32), every floating-point tensor
dequantized by gguf-py (``gguf.quants.dequantize``, llama.cpp's own reference) and stored as F32 under its name
and shape, integer tensors kept. The write goes to a temporary file renamed into place, so a half-written copy is
never taken for one. The weights equal the dequantized ones bit for bit, so llama.cpp on the copy computes with
exactly the numbers storelab and transformers load from the original.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["f32_copy"]

ALL_F32 = 0  # llama_ftype LLAMA_FTYPE_ALL_F32


def _key(src: Path) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as f:
        h.update(f.read(1 << 20))
    h.update(str(src.stat().st_size).encode())
    return h.hexdigest()[:16]


def f32_copy(src: str | Path, cache: str | Path | None = None) -> Path:
    """The fp32 copy of ``src`` (made on first use, then reused)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    src = Path(src)
    root = Path(cache) if cache is not None else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    out_dir = root / "storelab" / "bench" if cache is None else root
    out = out_dir / f"{src.stem}.{_key(src)}.f32.gguf"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    w = GGUFWriter(tmp, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    w.add_key_value("general.file_type", ALL_F32, GGUFValueType.UINT32)
    integers = {GGMLQuantizationType.I8, GGMLQuantizationType.I16, GGMLQuantizationType.I32,
              GGMLQuantizationType.I64}
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]  # numpy order (GGUF lists the fastest axis first)
        if t.tensor_type in integers:
            w.add_tensor(t.name, np.asarray(t.data).reshape(shape), raw_dtype=t.tensor_type)
            continue
        data = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
        w.add_tensor(t.name, np.ascontiguousarray(data))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out
