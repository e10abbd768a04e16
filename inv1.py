import torch, softmaxkit as sk
torch.manual_seed(0)
q = torch.randn(1, 2, 4, 8, dtype=torch.float64); k = torch.randn(1, 2, 6, 8, dtype=torch.float64); v = torch.randn(1, 2, 6, 8, dtype=torch.float64)
m = torch.zeros(4, 6, dtype=torch.float64); m[2] = -1e9
r = (0.2 * torch.randn(4, 2, 1, 1, dtype=torch.float64)); t = torch.randn(4, 2, 1, 1, dtype=torch.float64)
for meth in ["dense", "fused", "streaming"]:
    rr = r.clone().requires_grad_(); tt = t.clone().requires_grad_()
    o = sk.attention(q, k, v, "multimax", attn_mask=m, method=meth, r=rr, t=tt)
    gr, gt = torch.autograd.grad(o.sum(), [rr, tt])
    print(meth, o[0, :, 2, :3].tolist(), gt.flatten().tolist())
