"""One model argument for every command: a user's string -> what it names (``resolve``).

    src = resolve("Qwen/Qwen3.5-27B@main", offline=False)   # -> ModelSource(kind=Source.HUB, path=..., repo=...)
    cfg = model_config(src)                                   # the ModelConfig, no weights read
    folder = weights_path(src)                                # where load() reads the weights (local only)

What a string can be, tried in this order (``Source``, the ``kind`` of the result):

* ``zoo:NAME`` or ``hf://org/name...``: that kind only (the way out of an ambiguity below);
* a path (``./x``, ``/x``, ``~/x``, ``../x`` are paths only; a bare name is a path when it exists):
  a checkpoint folder (Hugging Face or ``storelab save``: ``Source.FOLDER``), a ``storelab train --out``
  folder (``Source.RUN``), a folder of ``.gguf`` files alone (its one GGUF), a ``.toml`` or a ``.json``
  storelab model file (``Source.MODEL_FILE``, today's ``--config``), a ``.json`` of Hugging Face's format
  (``Source.CONFIG_JSON``: it has ``model_type``), a ``.gguf`` file or the first shard of a split one
  (``x-00001-of-00003.gguf``: ``Source.GGUF``);
* a zoo name (``storelab.zoo.zoo_names()``; ``NAME`` with ``tiny=True``, ``NAME.tiny``, ``tiny-NAME``);
* a Hub repo id ``org/name[@revision][/file.gguf]`` (``Source.HUB``), looked up in the local Hugging Face
  cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``; the published layout
  ``models--org--name/snapshots/<commit>/`` with ``refs/<branch>``) through huggingface_hub's own
  ``snapshot_download(local_files_only=True)``. The revision is a commit hash or a ref (default ``main``).
  A snapshot may hold only config.json, config.json and safetensors, or GGUF files (the one GGUF is
  taken; several: an error listing them, pick one as ``org/name/file.gguf``).

A bare name that is two of these at once (a folder ``kimi-k3`` here and the zoo's ``kimi-k3``; a folder
``org/name`` here and that repo in the cache) is refused, naming both and how to say which. An unknown
name is a ValueError listing what was tried: the zoo names close to it, the path checked, the cache
folder looked in. Resolution reads and writes nothing but the small files that tell kinds apart (a JSON
file's keys, a folder's listing, the cache's refs).

Offline (``offline=True``, the commands' ``--offline``, or ``HF_HUB_OFFLINE`` set) a repo not in the
cache is an error naming the repo and the cache folder. Online, a repo not in the cache resolves with
``path=None``; ``model_config`` then fetches its config.json (``hf_hub_download``, into the cache, as
``hf download`` would) and ``safetensors_headers`` reads the shards' headers by HTTP range reads
(``get_safetensors_metadata``), never the weights. ``weights_path`` is local only: a repo whose weights
are not in the cache is an error saying ``hf download org/name``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import get_safetensors_metadata, hf_hub_download, scan_cache_dir, snapshot_download
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (CacheNotFound, CorruptedCacheException, HFValidationError,
                                    LocalEntryNotFoundError)

from storelab.files import read_json

__all__ = ["Source", "HubRepo", "ModelSource", "resolve", "zoo_source", "checkpoint_source", "checkpoint_weights",
           "model_file_source", "hub_cache", "is_offline", "fetch_config", "model_config", "hf_config_path",
           "weights_path", "safetensors_headers", "load"]


class Source(enum.Enum):
    """What a model argument names; the value is how messages say it."""
    ZOO = "a zoo model"
    MODEL_FILE = "a storelab model file"
    FOLDER = "a checkpoint folder"
    RUN = "a storelab train run folder"
    CONFIG_JSON = "a Hugging Face config.json"
    GGUF = "a GGUF file"
    HUB = "a Hugging Face Hub repo"

    @property
    def is_checkpoint(self) -> bool:
        """Whether a source of this kind is a published checkpoint (a Hugging Face config.json or a GGUF, weights
        perhaps beside it), not a storelab model with random weights or a train run."""
        return self in (Source.FOLDER, Source.GGUF, Source.HUB, Source.CONFIG_JSON)


@dataclass(frozen=True)
class HubRepo:
    """A Hub repo as asked (``revision`` None: main) and as found in ``cache`` (``commit`` None: not there)."""
    repo_id: str
    revision: str | None
    cache: Path
    filename: str | None = None   # a GGUF file of the repo, asked for or the only one
    commit: str | None = None

    @property
    def name(self) -> str:
        """The model's name: the repo's own (``Qwen3.5-27B``)."""
        return self.repo_id.split("/")[-1]

    @property
    def asked(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    def download_hint(self) -> str:
        rev = f" --revision {self.revision}" if self.revision else ""
        return f"hf download {self.repo_id}{' ' + self.filename if self.filename else ''}{rev}"


@dataclass(frozen=True)
class ModelSource:
    """A resolved model argument: its ``kind``, the local ``path`` to read (a folder or a file; None for a
    zoo model and for a Hub repo not in the cache), the ``zoo`` file's name and ``tiny``, the Hub ``repo``,
    and ``text`` as the user gave it."""
    text: str
    kind: Source
    path: Path | None = None
    zoo: str | None = None
    tiny: bool = False
    repo: HubRepo | None = None

    @property
    def origin(self) -> str:
        """Where it came from, for messages."""
        if self.kind is Source.ZOO:
            return f"the zoo ({self.zoo}{'.tiny' if self.tiny else ''})"
        if self.repo is not None:
            where = f"the Hugging Face cache {self.repo.cache}" if self.path is not None else "the Hub"
            return f"{self.repo.asked} from {where}"
        return str(self.path)

    def describe(self) -> str:
        return f"{self.text!r} ({self.kind.value}, {self.origin})"


# -- the environment ------------------------------------------------------------------------------
def hub_cache() -> Path:
    """The Hugging Face cache folder, read now: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else the default."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(hf_constants.HF_HUB_CACHE).expanduser()


def is_offline(offline: bool | None = None) -> bool:
    """``offline`` when given true, else whether ``HF_HUB_OFFLINE`` is set (to 1, true, yes or on), read now."""
    return bool(offline) or os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


# -- resolution -----------------------------------------------------------------------------------
HUB_ID = re.compile(r"(?P<org>[A-Za-z0-9][\w.-]*)/(?P<name>[\w.-]+?)(?:@(?P<rev>[\w.-]+))?"
                    r"(?:/(?P<file>[^@]+\.gguf))?(?:@(?P<rev2>[\w.-]+))?")
SHARD = re.compile(r"(?P<stem>.+)-(?P<k>\d{5})-of-(?P<n>\d{5})\.gguf")
EXPLICIT_PATH = ("/", "./", "../", "~", ".\\", "..\\")
STORELAB_KEYS = {"n_layers", "layers", "extends", "d_model", "stores"}   # a storelab model file's own keys


def resolve(text: str | Path, *, tiny: bool = False, offline: bool | None = None) -> ModelSource:
    """What ``text`` names (see the module docstring); a ValueError listing what was tried when nothing
    or more than one thing fits. ``tiny``: the zoo model's tiny version (refused for anything else)."""
    src = _resolve(str(text), offline=is_offline(offline))
    if tiny and src.kind is not Source.ZOO:
        raise ValueError(f"--tiny: picks the tiny version of a zoo model; it does nothing to {src.describe()} "
                         f"(leave it out)")
    return dataclasses.replace(src, tiny=True) if tiny else src


def _resolve(text: str, *, offline: bool) -> ModelSource:
    if not text.strip():
        raise ValueError("model: empty name (give a zoo model, a file or folder, or a Hub repo org/name)")
    if text.startswith("zoo:"):
        zoo = _zoo(text[4:])
        if zoo is None:
            raise ValueError(f"model: {text!r}: no zoo model {text[4:]!r}{_close_zoo(text[4:])}")
        return dataclasses.replace(zoo, text=text)
    if text.startswith("hf://"):
        m = HUB_ID.fullmatch(text[5:])
        if m is None:
            raise ValueError(f"model: {text!r}: not a Hub repo id (hf://org/name[@revision][/file.gguf])")
        return _hub(text, m, offline=offline)
    path = Path(text).expanduser()
    if text.startswith(EXPLICIT_PATH) or path.suffix in (".toml", ".json") or (path.suffix == ".gguf"
                                                                                  and text.count("/") != 2):
        if not path.exists():
            raise ValueError(f"model: {text!r}: {path.resolve()} does not exist (no such file or folder)")
        return _local(text, path)
    zoo = _zoo(text)
    m = HUB_ID.fullmatch(text)
    if path.exists():
        if zoo is not None:
            what = "folder" if path.is_dir() else "file"
            raise ValueError(f"model: {text!r} is both {Source.ZOO.value} and a {what} here ({path.resolve()}): "
                             f"give ./{text} for the path or zoo:{text} for the zoo model")
        hub = _hub(text, m, offline=True, missing_ok=True) if m is not None else None
        if hub is not None and hub.path is not None:
            raise ValueError(f"model: {text!r} is both a path here ({path.resolve()}) and a repo in the Hugging "
                             f"Face cache ({hub_cache()}): give ./{text} for the path or hf://{text} for the repo")
        return _local(text, path)
    if zoo is not None:
        return zoo
    if m is not None:
        return _hub(text, m, offline=offline)
    raise ValueError(f"model: {text!r}: unknown zoo model{_close_zoo(text)}; no file or folder "
                     f"{path.resolve()}; not a Hub repo id (org/name[@revision])")


def _zoo(text: str) -> ModelSource | None:
    """A zoo name in any spelling (``NAME``, ``NAME.tiny``, ``tiny-NAME``), or None."""
    from storelab.zoo import zoo_names

    base = text.removeprefix("tiny-").removesuffix(".tiny")
    if base not in zoo_names():
        return None
    return ModelSource(text=text, kind=Source.ZOO, zoo=base, tiny=base != text)


def _close_zoo(text: str) -> str:
    from storelab.zoo import zoo_names

    names = zoo_names()
    bare = text.removeprefix("tiny-").removesuffix(".tiny")
    close = difflib.get_close_matches(bare, names, n=3, cutoff=0.5)
    return f" (close: {', '.join(close)}; all: {', '.join(names)})" if close else f" (known: {', '.join(names)})"


def _local(text: str, path: Path) -> ModelSource:
    """A path that exists: its kind from its suffix, its keys or its listing."""
    if path.is_dir():
        from storelab.outputs import KINDS, folder_kind

        kind = folder_kind(path)
        if kind == "run":
            return ModelSource(text=text, kind=Source.RUN, path=path)
        if kind in ("hf", "save") and (path / "config.json").is_file():
            return ModelSource(text=text, kind=Source.FOLDER, path=path)
        ggufs = _first_shards(path)
        if ggufs:
            one = _one_gguf(ggufs, f"{path}", f"{path}/FILE.gguf")
            return ModelSource(text=text, kind=Source.GGUF, path=path / one)
        what = KINDS.get(kind, "a folder of no known kind") if kind not in ("hf", "save") else "a folder"
        raise ValueError(f"model: {text!r}: {path} is {what}, no model: no config.json and no .gguf file in it")
    if path.suffix == ".gguf":
        m = SHARD.fullmatch(path.name)
        if m is not None and int(m["k"]) != 1:
            raise ValueError(f"model: {text!r}: shard {int(m['k'])} of {int(m['n'])} of a split GGUF; give the "
                             f"first, {m['stem']}-00001-of-{m['n']}.gguf")
        return ModelSource(text=text, kind=Source.GGUF, path=path)
    if path.suffix == ".toml":
        return ModelSource(text=text, kind=Source.MODEL_FILE, path=path)
    if path.suffix == ".json":
        return ModelSource(text=text, kind=_json_kind(path), path=path)
    raise ValueError(f"model: {text!r}: {path} is a file of unknown type (expected a .toml or .json model file, "
                     f"a config.json, a .gguf file, or a checkpoint folder)")


def _json_kind(path: Path) -> Source:
    try:
        d = read_json(path)  # a FIFO named *.json is refused, not waited on
    except OSError as e:
        raise ValueError(f"model: {path}: not readable JSON: {e}") from None
    except ValueError as e:
        raise ValueError(f"model: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"model: {path}: expected a JSON object, got {type(d).__name__}")
    if "model_type" in d:
        return Source.CONFIG_JSON
    if STORELAB_KEYS & set(d):
        return Source.MODEL_FILE
    raise ValueError(f"model: {path}: neither a Hugging Face config.json (no model_type) nor a storelab model "
                     f"file (none of {', '.join(sorted(STORELAB_KEYS))})")


def _first_shards(folder: Path) -> list[str]:
    """The GGUF files of a folder, a split one by its first shard only."""
    out = []
    for p in sorted(folder.glob("*.gguf")):
        m = SHARD.fullmatch(p.name)
        if m is None or int(m["k"]) == 1:
            out.append(p.name)
    return out


def _one_gguf(names: list[str], where: str, how: str) -> str:
    if len(names) > 1:
        raise ValueError(f"model: {where} holds {len(names)} GGUF files ({', '.join(names)}); pick one as {how}")
    return names[0]


def _hub(text: str, m: re.Match, *, offline: bool, missing_ok: bool = False) -> ModelSource | None:
    """A repo id, looked up in the cache; not there: an error offline, ``path=None`` online (``missing_ok``:
    None instead of an error, for the ambiguity check)."""
    if m["rev"] and m["rev2"]:
        raise ValueError(f"model: {text!r}: two revisions; give org/name@REV/file.gguf")
    repo_id, cache = f"{m['org']}/{m['name']}", hub_cache()
    repo = HubRepo(repo_id=repo_id, revision=m["rev"] or m["rev2"], cache=cache, filename=m["file"])
    try:
        snap = Path(snapshot_download(repo_id, revision=repo.revision, cache_dir=cache, local_files_only=True,
                                      allow_patterns=["*.json", "*.safetensors", "*.gguf"]))
    except HFValidationError as e:
        if missing_ok:
            return None
        raise ValueError(f"model: {text!r}: not a Hub repo id: {e}") from None
    except LocalEntryNotFoundError as e:
        if missing_ok:
            return None
        if not offline:
            return ModelSource(text=text, kind=Source.HUB, repo=repo)
        here = Path(text).expanduser()
        nofolder = "" if text.startswith("hf://") else f"; no file or folder {here.resolve()} either"
        raise ValueError(f"model: {repo.asked}: not in the Hugging Face cache {cache} and offline "
                         f"({'--offline' if not is_offline() else 'HF_HUB_OFFLINE is set'}): "
                         f"{_cache_miss(repo, e)}{nofolder}; fetch it with `{repo.download_hint()}`") from None
    repo = dataclasses.replace(repo, commit=snap.name)
    if repo.filename is not None:
        if not (snap / repo.filename).is_file():
            raise ValueError(f"model: {text!r}: {repo.filename} is not in the cached snapshot {snap} "
                             f"(it holds: {', '.join(sorted(p.name for p in snap.iterdir())) or 'nothing'})")
        return ModelSource(text=text, kind=Source.HUB, path=snap / repo.filename, repo=repo)
    if not (snap / "config.json").is_file():
        ggufs = _first_shards(snap)
        if ggufs:
            name = _one_gguf(ggufs, f"{repo.asked} (cached at {snap})", f"{repo.repo_id}/FILE.gguf")
            return ModelSource(text=text, kind=Source.HUB, path=snap / name,
                               repo=dataclasses.replace(repo, filename=name))
        if missing_ok:
            return None
        raise ValueError(f"model: {repo.asked}: the cached snapshot {snap} holds no config.json and no .gguf file; "
                         f"fetch it with `{repo.download_hint()}`")
    return ModelSource(text=text, kind=Source.HUB, path=snap, repo=repo)


def _cache_miss(repo: HubRepo, err: Exception) -> str:
    """Why a repo is not in the cache: no folder for it (with cached repos close to its name), or not that
    revision (with the refs and commits that are there)."""
    folder = repo.cache / ("models--" + repo.repo_id.replace("/", "--"))
    if not folder.is_dir():
        try:
            ids = [r.repo_id for r in scan_cache_dir(repo.cache).repos if r.repo_type == "model"]
        except (CacheNotFound, CorruptedCacheException, OSError):   # no cache folder yet: nothing cached to list
            ids = []
        close = difflib.get_close_matches(repo.repo_id, ids, n=3, cutoff=0.5)
        return f"no folder {folder.name}" + (f" (cached: {', '.join(close)})" if close else "")
    refs = sorted(p.relative_to(folder / "refs").as_posix() for p in (folder / "refs").rglob("*") if p.is_file()) \
        if (folder / "refs").is_dir() else []
    commits = sorted(p.name for p in (folder / "snapshots").iterdir()) if (folder / "snapshots").is_dir() else []
    return (f"revision {repo.revision or 'main'!r} is not there (refs: {', '.join(refs) or 'none'}; "
            f"snapshots: {', '.join(c[:12] for c in commits) or 'none'})")


def checkpoint_source(path: str | Path) -> ModelSource:
    """``--checkpoint PATH`` as it always read: a folder, a config.json or a .gguf file, not checked here
    (the reader names a missing path)."""
    p = Path(path)
    kind = Source.FOLDER if p.is_dir() else Source.GGUF if p.suffix == ".gguf" else Source.CONFIG_JSON
    return ModelSource(text=str(path), kind=kind, path=p)


def zoo_source(name: str, tiny: bool = False) -> ModelSource:
    """A zoo model by its name, no path looked at (``storelab models`` with no name lists the zoo this way)."""
    src = _zoo(name)
    if src is None:
        raise ValueError(f"model: no zoo model {name!r}{_close_zoo(name)}")
    return dataclasses.replace(src, tiny=True) if tiny else src


def checkpoint_weights(path: str | Path, *, offline: bool | None = None) -> Path:
    """``--checkpoint X`` of a command that reads weights: a path as it always was (an existing one, or one
    written as a path: the command names it missing), else a Hub repo id whose weights are in the cache."""
    text = str(path)
    if Path(text).expanduser().exists() or text.startswith(EXPLICIT_PATH) or HUB_ID.fullmatch(text) is None:
        return Path(path)
    return weights_path(resolve(text, offline=offline))


def model_file_source(path: str | Path) -> ModelSource:
    """``--config FILE`` as it always read: a storelab model file, checked by its parser."""
    return ModelSource(text=str(path), kind=Source.MODEL_FILE, path=Path(path))


# -- reading what was resolved --------------------------------------------------------------------
def fetch_config(src: ModelSource) -> ModelSource:
    """A Hub repo not in the cache, online: its config.json fetched (``hf_hub_download``, into the cache, as
    ``hf download`` would; no weights) and the source pointed at that snapshot. Anything else: as it is.
    Only the commands that read a config alone (``models``, ``memory``) call it."""
    if src.kind is not Source.HUB or src.path is not None:
        return src
    repo = src.repo
    try:
        file = Path(hf_hub_download(repo.repo_id, "config.json", revision=repo.revision, cache_dir=repo.cache))
    except Exception as e:  # noqa: BLE001 - huggingface_hub's network errors are many; each is the user's to fix
        gguf = " (a GGUF repo? fetch its file with `hf download org/name FILE.gguf` and give org/name/FILE.gguf)"
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"model: {repo.asked}: config.json could not be fetched from the Hub: {type(e).__name__}: "
                         f"{first}{gguf if 'EntryNotFound' in type(e).__name__ else ''}") from None
    return dataclasses.replace(src, path=file.parent, repo=dataclasses.replace(repo, commit=file.parent.name))


def hf_config_path(src: ModelSource) -> Path:
    """The local folder, config.json or .gguf file the config readers take (``read_hf_config``)."""
    if not src.kind.is_checkpoint:
        raise ValueError(f"model: {src.describe()} has no Hugging Face config.json")
    if src.path is None:
        raise ValueError(f"model: {src.repo.asked}: not in the Hugging Face cache {src.repo.cache}; fetch it with "
                         f"`{src.repo.download_hint()}`")
    return src.path


def model_config(src: ModelSource):
    """The ModelConfig of a source, no weight read: a zoo model's file, a model file, or the checkpoint's
    config (named after the repo for a Hub repo; one not in the cache: ``fetch_config`` it first)."""
    from storelab.checkpoint.config_only import read_model_config
    from storelab.models.config import load_model
    from storelab.zoo import load_zoo

    if src.kind is Source.ZOO:
        return load_zoo(src.zoo, tiny=src.tiny)
    if src.kind is Source.MODEL_FILE:
        return load_model(src.path)
    if src.kind is Source.RUN:
        raise ValueError(f"model: {src.describe()}: export it first (storelab export {src.text} OUT), then give OUT")
    return named(src, read_model_config(hf_config_path(src)))


def named(src: ModelSource, cfg):
    """A Hub repo's model named after the repo (not the snapshot's commit folder)."""
    if src.repo is None or cfg.name == src.repo.name:
        return cfg
    title = cfg.title.replace(cfg.name, src.repo.name, 1) if cfg.title else cfg.title
    return dataclasses.replace(cfg, name=src.repo.name, title=title)


def weights_path(src: ModelSource) -> Path:
    """The folder (or .gguf file) whose weights ``storelab.checkpoint.load`` reads, local only: a config.json
    stands for its folder when the safetensors are beside it; a Hub repo must have its weights in the cache,
    else the error says how to fetch them."""
    if src.kind in (Source.ZOO, Source.MODEL_FILE):
        raise ValueError(f"model: {src.describe()} has no weights (random ones only)")
    if src.kind is Source.RUN:
        raise ValueError(f"model: {src.describe()}: export it first (storelab export {src.text} OUT), then give OUT")
    path = src.path
    if src.kind is Source.CONFIG_JSON:
        if not any(path.parent.glob("*.safetensors")):
            raise ValueError(f"model: {path}: a config.json with no safetensors beside it; give the checkpoint "
                             f"folder that holds its weights")
        return path.parent
    if src.kind is Source.HUB:
        if path is None:
            raise ValueError(f"model: {src.repo.asked}: not in the Hugging Face cache {src.repo.cache} (commands "
                             f"that run a model read only the cache); fetch it with `{src.repo.download_hint()}`")
        if path.is_dir() and not any(path.glob("*.safetensors")):
            raise ValueError(f"model: {src.repo.asked}: the cached snapshot {path} holds config.json but no "
                             f"weights; fetch them with `{src.repo.download_hint()}`")
    return path


def safetensors_headers(src: ModelSource) -> dict[str, dict[str, tuple[tuple[int, ...], str]]] | None:
    """For a Hub repo whose safetensors are not in the cache, online: each shard's tensors (shape, dtype)
    from the Hub by HTTP range reads of the headers (``get_safetensors_metadata``), no weight fetched.
    None for anything else (local shards are read by ``storelab.checkpoint.shards``)."""
    repo = src.repo
    if repo is None or is_offline() or repo.filename is not None:
        return None
    if src.path is not None and any(src.path.glob("*.safetensors")):
        return None
    try:
        meta = get_safetensors_metadata(repo.repo_id, revision=repo.revision)
    except Exception as e:  # noqa: BLE001 - huggingface_hub's network errors are many; each is the user's to fix
        raise ValueError(f"model: {repo.asked}: the safetensors headers could not be read from the Hub: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (give --weights-dtype "
                         f"to count parameters instead)") from None
    return {fname: {name: (tuple(t.shape), t.dtype) for name, t in fm.tensors.items()}
            for fname, fm in meta.files_metadata.items()}


def load(model: str | Path, *, device="cpu", dtype=None, tiny: bool = False, offline: bool | None = None):
    """``storelab.load(x)``: the Model that ``x`` names, any string a command takes. A checkpoint folder,
    a config.json with its safetensors beside it, a .gguf file or a Hub repo in the cache: its weights
    (``storelab.checkpoint.load``, in ``dtype``, None: its own). A zoo model or a model file: seeded by
    torch's global generator, random weights in ``dtype`` (None: fp32)."""
    from storelab.checkpoint.loader import load as load_checkpoint, resolve_dtype

    src = resolve(model, tiny=tiny, offline=offline)
    if src.kind in (Source.ZOO, Source.MODEL_FILE):
        from storelab.models.model import Model

        return Model(model_config(src)).eval().to(device=device, dtype=resolve_dtype(dtype or "fp32", {}))
    return load_checkpoint(weights_path(src), device=device, dtype=dtype)
