r"""How each normalizer streams over key blocks: its per-entry terms, sums and output.

A rule describes a normalizer as a fixed number of passes over the keys of each query.
Pass ``p`` maps the scores ``x`` of a tile to ``z = rule.z(p, x, st)`` and to per-entry
terms; the engine (:mod:`.streaming`) sums each term over the keys, either as a row sum
(``sum_j t_j``) or against the values (``sum_j t_j v_j``). A pass marked ``shifted``
keeps the running maximum ``m`` of ``z`` and evaluates its terms relative to
``c = rule.shift(m)``; when ``m`` grows the sums are rescaled by ``e^{c_old - c_new}``
(the online normalizer of Milakov & Gimelshein 2018, arXiv 1805.02867). Between passes,
``rule.stats`` turns the sums into per-query statistics (e.g. the entropy of adaptive
softmax); after the last pass ``rule.output`` gives the attention output.

Everything a rule computes is a differentiable function of the scores, the values,
the parameters and earlier statistics, so the engine's backward pass recomputes the
tiles and differentiates the rule: no rule writes its own gradient. ``st`` holds, per
query row: the parameters (``st["params"]``), the visible-key count ``n``, the final
shift ``c{p}`` and maximum ``m{p}`` of each shifted pass (``mn{p}``: the minimum, for
rules that track it) and the statistics of earlier passes.

The formulas are those of :mod:`softmaxkit.functional`, rearranged as sums over keys; the
tests check every rule against the dense reference ``registry.normalize``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as torch_f

from ..functional.softmax import ADAPTIVE_ENTROPY_THRESHOLD, ADAPTIVE_POLY, _polyval, multimax_modulator


def _keep(t: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """``t`` with invisible entries set to 0."""
    return t if visible is None else torch.where(visible, t, torch.zeros((), dtype=t.dtype, device=t.device))


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den > 0``; 0 for query rows with an empty denominator."""
    return num / torch.where(den > 0, den, torch.ones_like(den))


class StreamRule:
    """One normalizer as passes of summed terms (see the module docstring)."""

    name: str = ""
    passes: int = 1
    #: per pass: keep a running maximum of ``z`` and evaluate terms relative to ``shift(m)``
    shifted: tuple[bool, ...] = (True,)
    #: per pass: the terms summed against the values (the others are row sums)
    value_terms: tuple[frozenset, ...] = (frozenset({"num"}),)
    #: ``output`` uses the maximum ``m{p}`` of the last pass as a differentiable quantity
    max_grad: bool = False
    #: track the running minimum of ``z`` (differentiable ``mn{p}``) in the last pass
    min_grad: bool = False
    #: needs the number of visible keys of each query (``st["n"]``)
    needs_count: bool = False

    def z(self, p: int, x: torch.Tensor, st: dict) -> torch.Tensor:
        return x

    def shift(self, m: torch.Tensor) -> torch.Tensor:
        return m

    def terms(self, p: int, z: torch.Tensor, visible, st: dict) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def stats(self, p: int, sums: dict, st: dict) -> dict[str, torch.Tensor]:
        return {}

    def output(self, sums: dict, st: dict) -> torch.Tensor:
        raise NotImplementedError


def _exp_terms(z, visible, c):
    """``e^{z - c}`` at visible entries, 0 elsewhere."""
    if visible is None:
        return torch.exp(z - c)
    return _keep(torch.exp(torch.where(visible, z, c) - c), visible)


class SoftmaxFamily(StreamRule):
    """``softmax(z(x))``: output ``sum_j e^{z_j - c} v_j / sum_j e^{z_j - c}``."""

    value_terms = (frozenset({"num"}),)

    def terms(self, p, z, visible, st):
        e = _exp_terms(z, visible, st[f"c{p}"])
        return {"num": e, "den": e}

    def output(self, sums, st):
        return _safe_div(sums["num"], sums["den"])


class Softmax(SoftmaxFamily):
    name = "softmax"

    def z(self, p, x, st):
        t = st["params"].get("temperature", 1.0)
        return x * (1.0 / t if not isinstance(t, torch.Tensor) else t.reciprocal())


class SSMax(SoftmaxFamily):
    """``softmax(s log(n) x)``, ``n`` = visible keys of the query (or the ``n`` parameter)."""

    name = "ssmax"
    needs_count = True

    def z(self, p, x, st):
        params = st["params"]
        n = params.get("n")
        n = st["n"] if n is None else n
        log_n = torch.log(n.clamp_min(1.0)) if isinstance(n, torch.Tensor) else math.log(float(n))
        return x * (log_n * params.get("s", 0.43))


class MultiMax(SoftmaxFamily):
    name = "multimax"

    def z(self, p, x, st):
        params = st["params"]
        return multimax_modulator(x, _four(params.get("r")), _four(params.get("t")))


def _four(value):
    if isinstance(value, torch.Tensor):
        return [value[i] for i in range(4)]
    return [float(v) for v in value]


class AdaptiveSoftmax(SoftmaxFamily):
    """Pass 0: ``d = sum e^{x-c}``, ``E = sum x e^{x-c}``, entropy ``H = c + log d - E/d``;
    pass 1: ``softmax(beta x)`` with ``beta = max(poly(H), 1)`` where ``H > 0.5``."""

    name = "adaptive_softmax"
    passes = 2
    shifted = (True, True)
    value_terms = (frozenset(), frozenset({"num"}))

    def z(self, p, x, st):
        return x if p == 0 else x * st["beta"]

    def terms(self, p, z, visible, st):
        if p == 1:
            return super().terms(p, z, visible, st)
        e = _exp_terms(z, visible, st["c0"])
        return {"d": e, "E": e * z}

    def stats(self, p, sums, st):
        d, e_sum = sums["d"], sums["E"]
        entropy = torch.where(d > 0, st["c0"] + torch.log(torch.where(d > 0, d, torch.ones_like(d)))
                              - _safe_div(e_sum, d), torch.zeros_like(d))
        beta = torch.where(entropy > ADAPTIVE_ENTROPY_THRESHOLD,
                           _polyval(ADAPTIVE_POLY, entropy).clamp_min(1.0), torch.ones_like(entropy))
        if st["params"].get("detach_beta", False):
            beta = beta.detach()
        return {"beta": beta}


class SASoftmax(StreamRule):
    """Plain: ``sum x e^{x-c} v / sum e^{x-c}``. Normalized: the rescaling
    ``(x - low) / (high - low + eps)`` is affine in ``x``, so it splits into two value sums."""

    name = "sa_softmax"

    def __init__(self, normalized: bool = False):
        self.normalized = normalized
        self.value_terms = (frozenset({"num", "num0"}),) if normalized else (frozenset({"num"}),)
        self.max_grad = self.min_grad = normalized

    def terms(self, p, z, visible, st):
        e = _exp_terms(z, visible, st["c0"])
        out = {"num": e * z, "den": e}
        if self.normalized:
            out["num0"] = e
        return out

    def output(self, sums, st):
        plain = _safe_div(sums["num"], sums["den"])
        if not self.normalized:
            return plain
        low = st["mn0"].clamp_max(0.0)
        high = st["m0"].clamp_min(0.0)
        eps = st["params"].get("eps", 1e-6)
        return (plain - low * _safe_div(sums["num0"], sums["den"])) / (high - low + eps)


class Softpick(StreamRule):
    """``sum relu(e^{x-c} - e^{-c}) v / (sum |e^{x-c} - e^{-c}| + eps e^{m-c})``, ``c = max(m, 0)``."""

    name = "softpick"
    max_grad = True

    def shift(self, m):
        return m.clamp_min(0.0)

    def terms(self, p, z, visible, st):
        c = st["c0"]
        a = _keep(torch.exp(z - c) - torch.exp(-c), visible)
        return {"num": torch.relu(a), "den": a.abs()}

    def output(self, sums, st):
        eps = st["params"].get("eps", 1e-6)
        return sums["num"] / (sums["den"] + eps * torch.exp(st["m0"] - st["c0"]))


class StableMax(StreamRule):
    """``sum s(x) v / sum s(x)``, ``s(x) = x + 1`` for ``x >= 0`` and ``1 / (1 - x)`` below."""

    name = "stablemax"
    shifted = (False,)

    def terms(self, p, z, visible, st):
        s = torch.where(z >= 0, z.clamp_min(0) + 1.0, 1.0 / (1.0 - z.clamp_max(0)))
        s = _keep(s, visible)
        return {"num": s, "den": s}

    def output(self, sums, st):
        return _safe_div(sums["num"], sums["den"])


class ClippedSoftmax(StreamRule):
    """Pass 0: ``d = sum e^{x-c}``; pass 1: ``sum clip((zeta-gamma) e^{x-c}/d + gamma, 0, 1) v``."""

    name = "clipped_softmax"
    passes = 2
    shifted = (True, False)
    value_terms = (frozenset(), frozenset({"num"}))

    def terms(self, p, z, visible, st):
        e = _exp_terms(z, visible, st["c0"])
        if p == 0:
            return {"d": e}
        params = st["params"]
        gamma, zeta = params.get("gamma", -0.03), params.get("zeta", 1.0)
        prob = e / torch.where(st["d"] > 0, st["d"], torch.ones_like(st["d"]))
        return {"num": _keep(((zeta - gamma) * prob + gamma).clamp(0.0, 1.0), visible)}

    def stats(self, p, sums, st):
        return {"d": sums["d"]}

    def output(self, sums, st):
        return sums["num"]


class Elementwise(StreamRule):
    """``sum f(x) v`` (sigmoid, relu) or ``sum f(x) v / (sum f(x) + eps)`` (relu_l1, softplus_l1)."""

    shifted = (False,)

    def __init__(self, name: str):
        self.name = name
        self.needs_count = name in ("sigmoid", "relu")
        self.l1 = name in ("relu_l1", "softplus_l1")

    def terms(self, p, z, visible, st):
        params = st["params"]
        if self.name == "sigmoid":
            bias = params.get("bias")
            b = -torch.log(st["n"].clamp_min(1.0)) if bias is None else bias
            f = torch.sigmoid(z + (b + params.get("bias_offset", 0.0)))
        elif self.name == "relu":
            f = torch.relu(z) / st["n"].clamp_min(1.0)
        elif self.name == "relu_l1":
            f = torch.relu(z)
        else:
            f = torch_f.softplus(z)
        f = _keep(f, visible)
        return {"num": f, "den": f} if self.l1 else {"num": f}

    def output(self, sums, st):
        if not self.l1:
            return sums["num"]
        return sums["num"] / (sums["den"] + st["params"].get("eps", 1e-6))


def rule_for(name: str, params: dict) -> StreamRule | None:
    """The streaming rule of ``name`` with ``params``, or None when it has none.

    None for ``sparse_softmax`` (top-k needs whole rows), ``as_entmax``, ``entmax`` with a
    tensor (learnable) alpha or alpha outside ``(1, 2]``: those take the dense path."""
    simple = {"softmax": Softmax, "ssmax": SSMax, "multimax": MultiMax, "adaptive_softmax": AdaptiveSoftmax,
              "softpick": Softpick, "stablemax": StableMax, "clipped_softmax": ClippedSoftmax}
    if name in simple:
        return simple[name]()
    if name == "sa_softmax":
        return SASoftmax(bool(params.get("normalized", False)))
    if name in ("sigmoid", "relu", "relu_l1", "softplus_l1"):
        return Elementwise(name)
    alpha = {"sparsemax": 2.0, "entmax15": 1.5}.get(name, params.get("alpha") if name == "entmax" else None)
    if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and 1.0 < alpha <= 2.0:
        return Entmax(alpha)
    return None


class Entmax(StreamRule):
    r"""alpha-entmax for a number ``1 < alpha <= 2``: ``p_j = [u z_j - tau]_+^{1/u}``, ``u = alpha - 1``.

    The threshold is searched first (:meth:`search`, no gradient): ``tau`` lies in
    ``[u m - 1, u m - n^{-u}]`` (``m`` the row maximum: the largest weight is between
    ``1/n`` and 1), and each pass over the keys evaluates ``sum_j p_j(tau) - 1`` at
    :attr:`CANDIDATES` points of the bracket at once, until the bracket is at machine
    precision. Then pass 0 sums ``s_j = p_j^{2 - alpha}`` (the support's weights) and
    ``s_j z_j``, and pass 1 sums ``p_j v_j``. For the gradient, ``tau`` enters pass 1 as
    ``tau_0 + u (sum_j s_j z_j - \text{its value}) / sum_j s_j``, the implicit derivative
    of ``sum_j p_j = 1`` (``d tau = u sum_j s_j dz_j / sum_j s_j``), which gives the entmax
    Jacobian of Peters, Niculae & Martins (2019), arXiv 1905.05702.
    """

    name = "entmax"
    passes = 2
    shifted = (False, False)
    value_terms = (frozenset(), frozenset({"num"}))
    needs_count = True
    CANDIDATES = 15
    MAX_SEARCH_PASSES = 40

    def __init__(self, alpha: float):
        self.u = float(alpha) - 1.0

    def _weights(self, z, tau, visible):
        base = (self.u * z - tau).clamp_min(0.0)
        p = base if self.u == 1.0 else base ** (1.0 / self.u)
        return _keep(p, visible), base

    def search(self, reduce, st: dict) -> dict:
        """``tau`` per query row, by bracketing over passes (``reduce(fn)`` sums ``fn`` over keys)."""
        top = reduce(lambda z, visible: z if visible is None else z.masked_fill(~visible, float("-inf")),
                     "max")
        n = st["n"].expand_as(top)
        empty = n < 1
        m = torch.where(empty, torch.zeros_like(top), top)
        lo = self.u * m - 1.0
        hi = self.u * m - n.clamp_min(1.0) ** (-self.u)
        steps = torch.arange(1, self.CANDIDATES + 1, dtype=m.dtype, device=m.device) / (self.CANDIDATES + 1)
        tiny = torch.finfo(m.dtype).eps
        for _ in range(self.MAX_SEARCH_PASSES):
            width = hi - lo
            if bool((width <= 4 * tiny * (lo.abs() + hi.abs() + 1.0)).all()):
                break
            taus = lo + width * steps  # (..., r, K)

            def total(z, visible, taus=taus):
                p = (self.u * z.unsqueeze(-1) - taus.unsqueeze(-2)).clamp_min(0.0)
                if self.u != 1.0:
                    p = p ** (1.0 / self.u)
                if visible is not None:
                    p = p * visible.unsqueeze(-1)
                return p.sum(-2)

            mass = reduce(total, "sum")
            above = mass >= 1.0  # tau_k at or below the threshold
            below_count = above.sum(-1, keepdim=True)
            lo_new = torch.where(below_count > 0, taus.gather(-1, (below_count - 1).clamp_min(0)), lo)
            hi_new = torch.where(below_count < self.CANDIDATES,
                                 taus.gather(-1, below_count.clamp_max(self.CANDIDATES - 1)), hi)
            lo, hi = lo_new, hi_new
        return {"tau0": torch.where(empty, torch.zeros_like(lo), (lo + hi) / 2)}

    def terms(self, p, z, visible, st):
        if p == 0:
            _, base = self._weights(z, st["tau0"], visible)
            support = base > 0
            s = torch.where(support, base, torch.ones_like(base))
            s = torch.ones_like(s) if self.u == 1.0 else s ** (1.0 / self.u - 1.0)
            s = _keep(torch.where(support, s, torch.zeros_like(s)), visible)
            return {"lin": s.detach() * z, "S": s.detach()}
        weights, _ = self._weights(z, st["tau"], visible)
        return {"num": weights}

    def stats(self, p, sums, st):
        lin, s_total = sums["lin"], sums["S"]
        return {"tau": st["tau0"] + self.u * _safe_div(lin - lin.detach(), s_total)}

    def output(self, sums, st):
        return sums["num"]
