"""Stores over depth: how each block reads its input from, and writes its output into,
the representations of one token's pass (essay section 4).

Kinds: ``residual`` (plain sum, He et al., arXiv 1512.03385), ``mhc`` (Manifold-Constrained
Hyper-Connections, Xie et al., arXiv 2512.24880, after Hyper-Connections, Zhu et al., arXiv 2409.19606;
DeepSeek-V4, with V4.1-Flash's Single-Pass variant), ``attnres`` (Attention Residuals, arXiv 2603.15031).

The depth-mixer protocol (it differs from the token stores')
--------------------------------------------------------------
A model has ``n_sublayers`` sublayers, two per layer (token mixer, then channel
mixer), numbered ``0 .. n_sublayers - 1``. The config of a depth store is a
registered keyword-only dataclass like any store's (``CARD``, ``num_params``,
validation), and builds

* ``cfg.build(*, sublayer, n_sublayers) -> DepthMixer``, the mixer around one sublayer;
* ``cfg.build_head(*, n_sublayers) -> DepthHead``, the final read-out.

A ``DepthMixer`` has three methods:

* ``init(h_BTD) -> DepthState``  - only on sublayer 0's mixer, from the embedding;
* ``read(ds) -> x_BTD``           - the sublayer's input, before its norm;
* ``write(ds, y_BTD) -> DepthState`` - combine the sublayer's output.

and ``DepthHead.forward(ds) -> h_BTD`` gives the final representation. A block is::

    x = mixer.read(ds); y = store(norm(x)); ds = mixer.write(ds, y)

``read`` does not change what the state holds (mHC caches the sublayer's coefficients on
it so that ``write`` need not recompute them; ``write`` also works without a ``read``).
Depth configs declare ``SLOTS = (DEPTH,)``; their ``build`` takes the keywords above.

A depth state lives only within one token's pass: nothing carries from one token to
the next, so ``footprint(L)`` keeps 0 entries and 0 bytes at every context. What the
pass holds per token is ``cfg.depth_state_bytes(d_model, dtype, n_layers=...)``: one
vector (residual), n vectors (mHC; plus n fp32 coefficients for Single-Pass), and for
AttnRes the embedding, the completed group sums and the running sum, at most
``cfg.max_sources(n_layers)`` vectors.

``cfg.num_params(n_sublayers=N)`` counts every mixer of an N-sublayer model plus the head (None: one mixer).
Shape legend: B batch, T tokens, N streams, D model width, S depth sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from storelab.ops.norm import rms_norm
from storelab.ops.precision import at_least_fp32
from storelab.ops.sinkhorn import sinkhorn
from storelab.state import tensor_bytes
from storelab.stores.base import DEPTH, DTYPE_BYTES, Card, Footprint, ParamCount, StoreConfig, check_input, register

__all__ = [
    "DepthConfig", "DepthState", "ResidualState", "MHCState", "AttnResState", "DepthMixer", "DepthHead",
    "ResidualConfig", "MHCConfig", "AttnResConfig",
    "mhc_coefficients", "mhc_collapse", "mhc_combine", "depth_attend", "attnres_scores",
]


# ----------------------------------------------------------------------------- states
@dataclass
class DepthState:
    """What one token's pass holds between sublayers. ``nbytes()`` counts its tensors."""

    def nbytes(self) -> int:
        return tensor_bytes(*self._tensors())

    def _tensors(self) -> list[Tensor | None]:  # pragma: no cover - each subclass says
        raise NotImplementedError


@dataclass
class ResidualState(DepthState):
    h: Tensor  # B T D, the running sum

    def _tensors(self):
        return [self.h]


@dataclass
class MHCState(DepthState):
    streams: Tensor                # B T N D, the rows of X_l
    prev_pre: Tensor | None = None  # B T N fp32, A_{l-1} (kept only for Single-Pass)
    # this sublayer's (sublayer, A, C, B), cached by read() for write(); not part of the held state
    pending: tuple | None = field(default=None, repr=False)

    def _tensors(self):
        return [self.streams, self.prev_pre]


@dataclass
class AttnResState(DepthState):
    embedding: Tensor                                  # B T D
    groups: list[Tensor] = field(default_factory=list)  # completed group sums, each B T D
    partial: Tensor | None = None                      # running sum of the current group

    def _tensors(self):
        return [self.embedding, *self.groups, self.partial]

    def sources(self) -> list[Tensor]:
        """The candidates a read attends over: embedding, completed groups, running sum."""
        return [self.embedding, *self.groups] + ([] if self.partial is None else [self.partial])


class DepthMixer(nn.Module):
    """The mixer around one sublayer (see the module docstring for the protocol)."""

    def __init__(self, d_model: int, sublayer: int, n_sublayers: int):
        super().__init__()
        self.d_model, self.sublayer, self.n_sublayers = d_model, sublayer, n_sublayers

    def init(self, h_BTD: Tensor) -> DepthState:  # pragma: no cover
        raise NotImplementedError

    def read(self, ds: DepthState) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def write(self, ds: DepthState, y_BTD: Tensor) -> DepthState:  # pragma: no cover
        raise NotImplementedError

    def _check_first(self, h_BTD: Tensor) -> None:
        if self.sublayer != 0:
            raise ValueError(f"sublayer: init() belongs to sublayer 0's mixer, this is sublayer {self.sublayer}")
        check_input(h_BTD, self.d_model, "h")


class DepthHead(nn.Module):
    """The final read-out of a depth state: ``forward(ds) -> h_BTD``."""


class DepthConfig(StoreConfig):
    """Shared parts of the depth-store configs (declare subclasses ``@dataclass(kw_only=True)``)."""

    SLOTS, FAMILY = (DEPTH,), "depth"

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        # nothing is kept from one token to the next
        return Footprint(context=context, kept=0, read=0, state_bytes=0,
                         note="depth store: lives only within one token's pass")

    def _check_build(self, sublayer: int, n_sublayers: int) -> None:
        self.check(n_sublayers >= 1, "n_sublayers", f"must be >= 1, got {n_sublayers}")
        self.check(0 <= sublayer < n_sublayers, "sublayer", f"must be in [0, {n_sublayers}), got {sublayer}")

    def _vector_bytes(self, d_model: int | None, dtype: str) -> float:
        self.check(dtype in DTYPE_BYTES, "dtype", f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
        return (self.d_model if d_model is None else d_model) * DTYPE_BYTES[dtype]

    def build_head(self, *, n_sublayers: int) -> DepthHead:  # pragma: no cover
        raise NotImplementedError


# ============================================================================ residual
class ResidualMixer(DepthMixer):
    """h_{l+1} = h_l + F_l(h_l)."""

    def init(self, h_BTD):
        self._check_first(h_BTD)
        return ResidualState(h=h_BTD)

    def read(self, ds: ResidualState) -> Tensor:
        return ds.h

    def write(self, ds: ResidualState, y_BTD: Tensor) -> ResidualState:
        check_input(y_BTD, self.d_model, "y")
        return ResidualState(h=ds.h + y_BTD)


class ScaledResidualMixer(ResidualMixer):
    """h_{l+1} = s_l (h_l + F_l(h_l)): the plain sum, then the whole stream times a saved scalar (Gemma 4's
    ``layer_scalar``, after a layer's channel sublayer). ``scalar`` is a buffer: loaded, not trained."""

    def __init__(self, d_model: int, sublayer: int, n_sublayers: int):
        super().__init__(d_model, sublayer, n_sublayers)
        self.register_buffer("scalar", torch.ones(1))

    def write(self, ds: ResidualState, y_BTD: Tensor) -> ResidualState:
        check_input(y_BTD, self.d_model, "y")
        return ResidualState(h=(ds.h + y_BTD) * self.scalar.to(y_BTD.dtype))


class ResidualHead(DepthHead):
    def forward(self, ds: ResidualState) -> Tensor:
        return ds.h


@register("residual")
@dataclass(kw_only=True)
class ResidualConfig(DepthConfig):
    """The plain residual stream (He et al., arXiv 1512.03385): every block adds its output
    to one running sum, h_{l+1} = h_l + F_l(h_l). 0 parameters; the pass holds one vector
    of D per token; no context state. ``layer_scalar`` (Gemma 4): after each layer's channel sublayer the
    stream is multiplied by a saved scalar, h <- s_l (h + F(h)): one number per layer."""

    d_model: int
    layer_scalar: bool = False

    CARD_ORDER = 160
    CARD: ClassVar[Card] = Card(
        name="Residual stream", written_by="each block, within one token's pass", holds="one running sum",
        reading_costs="one vector", forgets="nothing is removed; later blocks add on top", source="arXiv 1512.03385")

    def __post_init__(self):
        self.check_positive("d_model")

    def build(self, *, sublayer: int, n_sublayers: int) -> ResidualMixer:
        self._check_build(sublayer, n_sublayers)
        scaled = self.layer_scalar and sublayer % 2 == 1  # after the layer's channel sublayer
        return (ScaledResidualMixer if scaled else ResidualMixer)(self.d_model, sublayer, n_sublayers)

    def build_head(self, *, n_sublayers: int) -> ResidualHead:
        self._check_build(0, n_sublayers)
        return ResidualHead()

    def num_params(self, *, n_sublayers: int | None = None) -> ParamCount:
        if not self.layer_scalar:
            return ParamCount(0, 0)
        n = 1 if n_sublayers is None else n_sublayers // 2  # one scalar per layer
        return ParamCount(n, n)

    def depth_state_bytes(self, d_model: int | None = None, dtype: str = "bf16", *, n_layers: int | None = None) -> int:
        return math.ceil(self._vector_bytes(d_model, dtype))


# ================================================================================= mHC
def mhc_coefficients(streams_BTND: Tensor, weight: Tensor, bias: Tensor, scale: Tensor, *, n_coef: tuple[int, ...],
                     norm_eps: float) -> list[Tensor]:
    """Token-dependent mixing coefficients from the current streams (fp32).

    z = RMSNorm(flatten(X_l)) @ weight^T, split into len(n_coef) pieces of the given sizes;
    piece i becomes ``z_i * scale[i] + bias_i``. The caller applies the activations.
    """
    B, T, N, D = streams_BTND.shape
    flat = rms_norm(at_least_fp32(streams_BTND.reshape(B, T, N * D)), eps=norm_eps)   # B T ND
    z = flat @ at_least_fp32(weight).t()                                              # B T sum(n_coef)
    zs, bs = z.split(list(n_coef), dim=-1), at_least_fp32(bias).split(list(n_coef))
    return [zi * at_least_fp32(scale[i]) + bi for i, (zi, bi) in enumerate(zip(zs, bs))]


def mhc_collapse(streams_BTND: Tensor, pre_BTN: Tensor) -> Tensor:
    """The block's input A X: a weighted sum of the streams (computed in fp32)."""
    return torch.einsum("btn,btnd->btd", at_least_fp32(pre_BTN), at_least_fp32(streams_BTND)).to(streams_BTND.dtype)


def mhc_combine(streams_BTND: Tensor, y_BTD: Tensor, post_BTN: Tensor, mix_BTNN: Tensor) -> Tensor:
    """X_{l+1} = B X_l + C y, with ``mix[k, j]`` the weight of old stream j in new stream k."""
    dt = streams_BTND.dtype
    mixed = torch.einsum("btkj,btjd->btkd", mix_BTNN.to(dt), streams_BTND)
    return mixed + post_BTN.to(dt).unsqueeze(-1) * y_BTD.unsqueeze(-2)


class MHCMixer(DepthMixer):
    """X_{l+1} = B_l X_l + C_l F_l(A_l X_l); A, C, B computed from X_l.

    Parameters: ``weight`` [(2+N)N, N D], ``bias`` [(2+N)N], ``scale`` [3] (for A, C, B).
    """

    def __init__(self, cfg: "MHCConfig", sublayer: int, n_sublayers: int):
        super().__init__(cfg.d_model, sublayer, n_sublayers)
        N = cfg.n_streams
        self.cfg = cfg
        self.weight = nn.Parameter(torch.randn((2 + N) * N, N * cfg.d_model) * 0.02)
        self.bias = nn.Parameter(torch.zeros((2 + N) * N))
        self.scale = nn.Parameter(torch.ones(3))

    def coefficients(self, streams_BTND: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(A [B,T,N], C [B,T,N], B [B,T,N,N]) for these streams, in fp32."""
        c, N = self.cfg, self.cfg.n_streams
        a, p, b = mhc_coefficients(streams_BTND, self.weight, self.bias, self.scale, n_coef=(N, N, N * N),
                                   norm_eps=c.norm_eps)
        pre = torch.sigmoid(a) + c.eps
        post = 2 * torch.sigmoid(p)
        # sinkhorn's rows are the source stream j, columns the destination k; transpose to B[k, j]
        mix = sinkhorn(b.unflatten(-1, (N, N)), c.sinkhorn_iters, c.eps).transpose(-1, -2)
        return pre, post, mix

    def init(self, h_BTD):
        self._check_first(h_BTD)
        return MHCState(streams=h_BTD.unsqueeze(2).expand(-1, -1, self.cfg.n_streams, -1).contiguous())

    def _pending(self, ds: MHCState):
        if ds.pending is None or ds.pending[0] != self.sublayer:
            ds.pending = (self.sublayer, *self.coefficients(ds.streams))
        return ds.pending[1:]

    def read(self, ds: MHCState) -> Tensor:
        pre, _, _ = self._pending(ds)
        if self.cfg.single_pass and ds.prev_pre is not None:
            pre = ds.prev_pre  # Single-Pass: A_{l-1}, computed one sublayer earlier
        return mhc_collapse(ds.streams, pre)

    def write(self, ds: MHCState, y_BTD: Tensor) -> MHCState:
        check_input(y_BTD, self.d_model, "y")
        pre, post, mix = self._pending(ds)
        return MHCState(streams=mhc_combine(ds.streams, y_BTD, post, mix),
                        prev_pre=pre if self.cfg.single_pass else None)


class MHCHead(DepthHead):
    """h = A X_L with A = sigmoid(RMSNorm(flatten X_L) W^T * scale + bias) + eps: ``weight`` [N, N D]."""

    def __init__(self, cfg: "MHCConfig"):
        super().__init__()
        self.cfg = cfg
        N = cfg.n_streams
        self.weight = nn.Parameter(torch.randn(N, N * cfg.d_model) * 0.02)
        self.bias = nn.Parameter(torch.zeros(N))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, ds: MHCState) -> Tensor:
        (a,) = mhc_coefficients(ds.streams, self.weight, self.bias, self.scale, n_coef=(self.cfg.n_streams,),
                                norm_eps=self.cfg.norm_eps)
        return mhc_collapse(ds.streams, torch.sigmoid(a) + self.cfg.eps)


@register("mhc")
@dataclass(kw_only=True)
class MHCConfig(DepthConfig):
    """Manifold-Constrained Hyper-Connections (Xie et al., arXiv 2512.24880), as in DeepSeek-V4.

    Update: N residual streams X_l [N, D]; around each sublayer F_l,
    X_{l+1} = B_l X_l + C_l F_l(A_l X_l), where from z = RMSNorm(flatten X_l) W_l:
    A = sigmoid(.) + eps (pre-mix, a row of N), C = 2 sigmoid(.) (post, a column of N),
    B = Sinkhorn(softmax(.)) with ``sinkhorn_iters`` rounds (rows exact, columns close
    to 1). ``single_pass`` (DeepSeek-V4.1-Flash) reads the block input with A_{l-1}
    instead of A_l (the first sublayer uses its own). Starts from N copies of the
    embedding; the head collapses with its own learned A.
    Parameters per mixer: (2+N) N (N D + 1) + 3; head N (N D + 1) + 1.
    Per token the pass holds N vectors of D (plus N fp32 numbers for Single-Pass).
    """

    d_model: int
    n_streams: int = 4
    sinkhorn_iters: int = 20
    eps: float = 1e-6
    norm_eps: float = 1e-6
    single_pass: bool = False

    CARD_ORDER = 170
    CARD: ClassVar[Card] = Card(
        name="mHC streams", written_by="each block, within one token's pass", holds="four running sums",
        reading_costs="a learned mix of the four",
        forgets="differences between the streams, which contract at every layer", source="arXiv 2512.24880")

    def __post_init__(self):
        self.check_positive("d_model", "n_streams")
        self.check(self.sinkhorn_iters >= 1, "sinkhorn_iters", f"must be >= 1, got {self.sinkhorn_iters}")
        self.check(self.eps >= 0, "eps", f"must be >= 0, got {self.eps}")
        self.check(self.norm_eps >= 0, "norm_eps", f"must be >= 0, got {self.norm_eps}")

    def build(self, *, sublayer: int, n_sublayers: int) -> MHCMixer:
        self._check_build(sublayer, n_sublayers)
        return MHCMixer(self, sublayer, n_sublayers)

    def build_head(self, *, n_sublayers: int) -> MHCHead:
        self._check_build(0, n_sublayers)
        return MHCHead(self)

    def num_params(self, *, n_sublayers: int | None = None) -> ParamCount:
        N, D = self.n_streams, self.d_model
        mixer = (2 + N) * N * (N * D + 1) + 3
        if n_sublayers is None:
            return ParamCount(mixer, mixer)
        total = n_sublayers * mixer + N * (N * D + 1) + 1
        return ParamCount(total, total)

    def depth_state_bytes(self, d_model: int | None = None, dtype: str = "bf16", *, n_layers: int | None = None) -> int:
        coef = 4 * self.n_streams if self.single_pass else 0
        return math.ceil(self.n_streams * self._vector_bytes(d_model, dtype)) + coef


# ============================================================================= AttnRes
def depth_attend(scores_BTS: Tensor, values_BTSD: Tensor) -> Tensor:
    """h = sum_i softmax(scores)_i v_i over the S depth sources (fp32 softmax)."""
    w = torch.softmax(at_least_fp32(scores_BTS), dim=-1)
    return torch.einsum("bts,btsd->btd", w, at_least_fp32(values_BTSD)).to(values_BTSD.dtype)


def attnres_scores(query_D: Tensor, keys_BTSD: Tensor, *, scale: float) -> Tensor:
    """Scores of the (already normalised) keys against one learned query: scale * q . k_i."""
    return torch.einsum("btsd,d->bts", at_least_fp32(keys_BTSD), at_least_fp32(query_D)) * scale


class _AttnResRead(nn.Module):
    """One learned query (and optional norm weight) that reads the depth sources."""

    def __init__(self, cfg: "AttnResConfig"):
        super().__init__()
        self.cfg = cfg
        self.query = nn.Parameter(torch.zeros(cfg.d_model))  # zero: starts as a plain average
        self.norm_weight = nn.Parameter(torch.ones(cfg.d_model)) if cfg.key_norm_weight else None

    def attend(self, sources: list[Tensor]) -> Tensor:
        c = self.cfg
        v_BTSD = torch.stack(sources, dim=2)
        k_BTSD = rms_norm(at_least_fp32(v_BTSD), self.norm_weight, eps=c.norm_eps)
        scale = c.d_model ** -0.5 if c.scale_scores else 1.0
        scores = attnres_scores(self.query, k_BTSD, scale=scale)
        return depth_attend(scores, k_BTSD if c.normalize_values else at_least_fp32(v_BTSD)).to(v_BTSD.dtype)


class AttnResMixer(DepthMixer):
    """Reads a softmax over [embedding, completed group sums, running group sum]; writes y into
    the running sum, closing the group at its last sublayer."""

    def __init__(self, cfg: "AttnResConfig", sublayer: int, n_sublayers: int):
        super().__init__(cfg.d_model, sublayer, n_sublayers)
        self.cfg = cfg
        # sublayer 0 has a single candidate, the embedding, and reads it unchanged
        self.reader = _AttnResRead(cfg) if sublayer > 0 else None
        self.closes_group = (sublayer == n_sublayers - 1
                             or cfg.group_of(sublayer + 1) != cfg.group_of(sublayer))

    def init(self, h_BTD):
        self._check_first(h_BTD)
        return AttnResState(embedding=h_BTD)

    def read(self, ds: AttnResState) -> Tensor:
        if self.reader is None:
            return ds.embedding
        return self.reader.attend(ds.sources())

    def write(self, ds: AttnResState, y_BTD: Tensor) -> AttnResState:
        check_input(y_BTD, self.d_model, "y")
        partial = y_BTD if ds.partial is None else ds.partial + y_BTD
        if self.closes_group:
            return AttnResState(embedding=ds.embedding, groups=[*ds.groups, partial], partial=None)
        return AttnResState(embedding=ds.embedding, groups=list(ds.groups), partial=partial)


class AttnResHead(DepthHead):
    """The final aggregation: one more learned query over every source."""

    def __init__(self, cfg: "AttnResConfig"):
        super().__init__()
        self.reader = _AttnResRead(cfg)

    def forward(self, ds: AttnResState) -> Tensor:
        return self.reader.attend(ds.sources())


@register("attnres")
@dataclass(kw_only=True)
class AttnResConfig(DepthConfig):
    """Block Attention Residuals (Kimi Team, arXiv 2603.15031), as in Kimi K3.

    Update: sublayers are grouped (``group_size`` layers of 2 sublayers when ``count`` is
    "layers", ``group_size`` sublayers when "sublayers"); each group's outputs are summed.
    Sublayer l > 0 reads h_l = sum_i softmax_i(s * q_l . k_i) v_i over the candidates v_i:
    the embedding, the completed group sums and the running sum of the current group (if
    non-empty), with k_i = RMSNorm(v_i) (times a learned weight if ``key_norm_weight``),
    s = D^-0.5 if ``scale_scores`` else 1, and values k_i if ``normalize_values`` else the
    raw v_i. Sublayer 0 reads the embedding unchanged; the head reads with its own query.
    (Inkling2BlockAttentionResidual: normalize_values, scale_scores, no norm weight.)
    Parameters: D per query (+ D with ``key_norm_weight``), for sublayers 1.. and the head.
    Per token the pass holds at most ``max_sources(n_layers)`` vectors of D.
    """

    d_model: int
    group_size: int = 12
    count: str = "layers"
    normalize_values: bool = False
    key_norm_weight: bool = True
    scale_scores: bool = False
    norm_eps: float = 1e-6

    CARD_ORDER = 180
    CARD: ClassVar[Card] = Card(
        name="AttnRes", written_by="each group of layers, within one token's pass", holds="up to nine sums in K3",
        reading_costs="attention over the sums",
        forgets="distinctions between the layers of a group, which are summed", source="arXiv 2603.15031")

    def __post_init__(self):
        self.check_positive("d_model", "group_size")
        self.check(self.count in ("layers", "sublayers"), "count",
                   f"must be 'layers' or 'sublayers', got {self.count!r}")
        self.check(self.norm_eps >= 0, "norm_eps", f"must be >= 0, got {self.norm_eps}")

    def group_of(self, sublayer: int) -> int:
        """Index of the group that sublayer ``sublayer`` writes into."""
        unit = sublayer // 2 if self.count == "layers" else sublayer
        return unit // self.group_size

    def sources_at(self, sublayer: int) -> int:
        """Candidates the read of ``sublayer`` attends over (pass ``n_sublayers`` for the head)."""
        if sublayer == 0:
            return 1
        # the embedding plus every group written so far: the last of them is either the
        # running sum (sublayer continues its group) or a completed one (it starts a new group)
        return 2 + self.group_of(sublayer - 1)

    def max_sources(self, n_layers: int) -> int:
        """Most candidates any read sees in an ``n_layers``-layer model (K3: 93 layers -> 9)."""
        self.check(n_layers >= 1, "n_layers", f"must be >= 1, got {n_layers}")
        n = 2 * n_layers
        return max(self.sources_at(s) for s in range(n + 1))  # the head's, as counts only grow

    def build(self, *, sublayer: int, n_sublayers: int) -> AttnResMixer:
        self._check_build(sublayer, n_sublayers)
        return AttnResMixer(self, sublayer, n_sublayers)

    def build_head(self, *, n_sublayers: int) -> AttnResHead:
        self._check_build(0, n_sublayers)
        return AttnResHead(self)

    def num_params(self, *, n_sublayers: int | None = None) -> ParamCount:
        reader = self.d_model * (2 if self.key_norm_weight else 1)
        total = reader if n_sublayers is None else n_sublayers * reader  # sublayers 1.. plus the head
        return ParamCount(total, total)

    def depth_state_bytes(self, d_model: int | None = None, dtype: str = "bf16", *, n_layers: int | None = None) -> int:
        self.check(n_layers is not None, "n_layers", "AttnRes needs the model's layer count")
        return math.ceil(self.max_sources(n_layers) * self._vector_bytes(d_model, dtype))
