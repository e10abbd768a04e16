"""Each method's attention weights written out densely (the L x L quadratic form), from the
definitions in the papers / official code, independently of softmaxkit.linear's engine."""

import math

import torch
import torch.nn.functional as torch_f


def visibility(b, h, lq, lk, causal, key_mask):
    vis = torch.ones(b, h, lq, lk, dtype=torch.bool)
    if causal:
        i = torch.arange(lq)[:, None] + (lk - lq)
        vis = vis & (torch.arange(lk)[None, :] <= i)
    if key_mask is not None:
        vis = vis & key_mask
    return vis


def weights(method, q, k, causal=False, key_mask=None, scale=None, **params):
    """``a_ij`` of ``method`` (``(B, H, Lq, Lk)``), 0 on invisible keys."""
    b, h, lq, d = q.shape
    lk = k.shape[-2]
    if k.shape[1] != h:
        k = k.repeat_interleave(h // k.shape[1], dim=1)
    scale = 1 / math.sqrt(d) if scale is None else scale
    vis = visibility(b, h, lq, lk, causal, key_mask)
    visf = vis.to(q.dtype)
    n = visf.sum(-1, keepdim=True)
    safe_n = n.clamp_min(1)
    if method in ("linear", "mala"):
        s = (torch_f.elu(q) + 1) @ (torch_f.elu(k) + 1).transpose(-2, -1)
    elif method == "performer":
        w = params["projection"]
        def phi(x):
            x = x * math.sqrt(scale)
            return torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(w.shape[0])
        s = phi(q) @ phi(k).transpose(-2, -1)
    elif method == "cosformer":
        m = params.get("max_len") or max(lq, lk)
        pq = torch.arange(lq, dtype=q.dtype) + (lk - lq if causal else 0)
        pk = torch.arange(lk, dtype=q.dtype)
        s = (torch.relu(q) @ torch.relu(k).transpose(-2, -1)) * torch.cos(math.pi / 2 * (pq[:, None] - pk[None]) / m)
    elif method == "inline":
        kern = params.get("kernel", "identity")
        f = {"identity": lambda x: x, "relu": torch.relu, "leakyrelu": torch_f.leaky_relu,
             "exp": lambda x: torch.exp(0.2 * x)}[kern]
        s = f(q) @ f(k).transpose(-2, -1)
    else:
        raise ValueError(method)
    s = s * visf
    if method in ("linear", "performer", "cosformer"):
        a = s / s.sum(-1, keepdim=True).clamp_min(params.get("eps", 1e-6))
    elif method == "inline":
        a = (1 / safe_n + scale / safe_n * (s - s.sum(-1, keepdim=True) / safe_n)) * visf
    else:  # mala
        z = scale * s.sum(-1, keepdim=True) / safe_n
        a = ((1 + 1 / (z + params.get("eps", 1e-6))) * scale / safe_n * s - z / safe_n) * visf
    return a


def attention(method, q, k, v, causal=False, key_mask=None, scale=None, **params):
    h = q.shape[1]
    if v.shape[1] != h:
        v = v.repeat_interleave(h // v.shape[1], dim=1)
    return weights(method, q, k, causal, key_mask, scale, **params) @ v
