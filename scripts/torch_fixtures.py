#!/usr/bin/env python3
"""Writes tests/data/torch_vision.safetensors (and, further down, torch_transformer,
torch_layers and torch_linalg): inputs, outputs and input gradients of the
convolutional ops computed by PyTorch in float64, which tests/vision.rs compares kiln with
(so CI checks agreement with PyTorch itself without installing it). Regenerate with
`python scripts/torch_fixtures.py` (needs torch and safetensors)."""
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(0)
out = {}


def case(name, fn, *inputs):
    xs = [t.clone().double().requires_grad_(True) for t in inputs]
    y = fn(*xs)
    r = torch.randn_like(y)
    grads = torch.autograd.grad((y * r).sum(), xs)
    for i, x in enumerate(xs):
        out[f"{name}.in{i}"] = x.detach().clone().contiguous()
        out[f"{name}.grad{i}"] = grads[i].contiguous()
    out[f"{name}.r"] = r.contiguous()
    out[f"{name}.out"] = y.detach().contiguous()


x = torch.randn(2, 4, 7, 6)
case("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2),
     x, torch.randn(6, 2, 3, 2), torch.randn(6))
conv = torch.nn.Conv2d(4, 3, (3, 2), padding=(1, 2), padding_mode="reflect", bias=False).double()
case("conv2d_reflect", lambda x, w: F.conv2d(F.pad(x, (2, 2, 1, 1), mode="reflect"), w), x, conv.weight.detach())
case("conv2d_same", lambda x, w: F.conv2d(x, w, padding="same", dilation=(1, 2)), x, torch.randn(3, 4, 2, 3))
case("conv1d", lambda x, w: F.conv1d(x, w, stride=2, padding=1, dilation=2, groups=2),
     torch.randn(2, 4, 11), torch.randn(6, 2, 3))
case("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2, dilation=(2, 1)),
     torch.randn(2, 4, 3, 5), torch.randn(4, 3, 3, 2), torch.randn(6))
case("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), x)
out["max_pool2d.indices"] = F.max_pool2d(x.double(), 3, 2, 1, ceil_mode=True, return_indices=True)[1]
case("avg_pool2d", lambda x: F.avg_pool2d(x, (3, 2), (2, 3), 1, ceil_mode=True, count_include_pad=False), x)
case("avg_pool2d_pad", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), x)
case("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (3, 4)), x)
case("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (5, 4)), x)
case("bilinear", lambda x: F.interpolate(x, size=(9, 7), mode="bilinear", align_corners=False), x)
case("bilinear_align", lambda x: F.interpolate(x, size=(9, 7), mode="bilinear", align_corners=True), x)
case("bilinear_scale", lambda x: F.interpolate(x, scale_factor=(0.5, 2.0), mode="bilinear"), x)
case("nearest_scale", lambda x: F.interpolate(x, scale_factor=(2.0, 1.5), mode="nearest"), x)
case("nearest_size", lambda x: F.interpolate(x, size=(4, 9), mode="nearest"), x)
for mode in ["reflect", "replicate", "circular"]:
    case(f"pad_{mode}", lambda x, m=mode: F.pad(x, (2, 1, 1, 2), mode=m), x)
case("unfold", lambda x: F.unfold(x, (2, 3), dilation=(2, 1), padding=1, stride=(1, 2)), x)
case("fold", lambda c: F.fold(c, (7, 6), (2, 3), dilation=(2, 1), padding=1, stride=(1, 2)), torch.randn(2, 24, 21))
case("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), x, torch.randn(4), torch.randn(4))
rm, rv = torch.randn(4).double(), torch.rand(4).double() + 0.5
out["batch_norm.running_mean_before"], out["batch_norm.running_var_before"] = rm.clone(), rv.clone()
case("batch_norm", lambda x, w, b: F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3), x, torch.randn(4), torch.randn(4))
# `case` ran the forward once: the running statistics moved once.
out["batch_norm.running_mean"], out["batch_norm.running_var"] = rm, rv
# The activations and special functions of transformer code.
a = torch.randn(5, 7) * 3
case("silu", F.silu, a)
case("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), a)
case("softplus", lambda x: F.softplus(x, beta=2.0, threshold=5.0), a)
case("leaky_relu", lambda x: F.leaky_relu(x, 0.1), a)
case("elu", lambda x: F.elu(x, 1.5), a)
case("log1p", lambda x: torch.log1p(x.abs()), a)
case("expm1", torch.expm1, a)
case("rms_norm", lambda x, w: F.rms_norm(x, (7,), w), a, torch.randn(7))
save_file({k: v.contiguous() for k, v in out.items()}, "tests/data/torch_vision.safetensors")
print(f"wrote {len(out)} tensors")

# Attention and a whole pre-norm transformer block: tests/data/torch_transformer.safetensors.
out = {}
q, k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 1, 6, 5), torch.randn(2, 1, 6, 7)
float_mask = torch.randn(4, 6)
bool_mask = torch.rand(2, 1, 4, 6) > 0.3
bool_mask[..., 0] = True  # every query keeps a key
out["sdpa_bool.mask"] = bool_mask
out["sdpa_float.mask"] = float_mask.double()
case("sdpa_plain", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
case("sdpa_float", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask.double(), scale=0.3), q, k, v)
case("sdpa_bool", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask), q, k, v)
qc = torch.randn(2, 3, 6, 5)
case("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), qc, k, v)

E, H, T = 8, 2, 5
ln1, ln2 = torch.nn.LayerNorm(E).double(), torch.nn.LayerNorm(E).double()
mha = torch.nn.MultiheadAttention(E, H, batch_first=True).double()
fc1, fc2 = torch.nn.Linear(E, 4 * E).double(), torch.nn.Linear(4 * E, E).double()
with torch.no_grad():
    for m in [ln1, ln2, mha, fc1, fc2]:
        for p_ in m.parameters():
            p_.copy_(torch.randn_like(p_) * 0.5)
params = {"ln1": ln1, "attn": mha, "ln2": ln2, "fc1": fc1, "fc2": fc2}
causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)


def block(x):
    h = ln1(x)
    x = x + mha(h, h, h, attn_mask=causal, need_weights=False)[0]
    return x + fc2(F.gelu(fc1(ln2(x)), approximate="tanh"))


x = torch.randn(2, T, E).double().requires_grad_(True)
y = block(x)
r = torch.randn_like(y)
named = [(f"{m}.{n}", p_) for m, mod in params.items() for n, p_ in mod.named_parameters()]
grads = torch.autograd.grad((y * r).sum(), [x] + [p_ for _, p_ in named])
out["block.x"], out["block.out"], out["block.r"], out["block.grad_x"] = x.detach(), y.detach(), r, grads[0]
for (n, p_), g in zip(named, grads[1:]):
    out[f"block.param.{n}"] = p_.detach().clone()
    out[f"block.grad.{n}"] = g
# The rest of the transformer vocabulary.
a = torch.randn(4, 9)
a[1, 3] = 0.0  # cumprod's gradient through a zero
case("cumprod", lambda x: torch.cumprod(x, 1), a)
case("atan", lambda x: torch.atan(x * 3), a)
case("vector_norm_3", lambda x: torch.linalg.vector_norm(x, 3, dim=1), a)
case("vector_norm_2", lambda x: torch.linalg.vector_norm(x, 2, dim=0), a)
case("vector_norm_inf", lambda x: torch.linalg.vector_norm(x, float("inf")), a)
case("sort", lambda x: torch.sort(x, dim=1, descending=True, stable=True)[0], a)
out["sort.indices"] = torch.sort(a.double(), dim=1, descending=True, stable=True)[1]
case("topk", lambda x: torch.topk(x, 3, 0, largest=False)[0], a)
out["topk.indices"] = torch.topk(a.double(), 3, 0, largest=False)[1]
case("roll", lambda x: torch.roll(x, (1, -2), (0, 1)), a)
ids = torch.tensor([[3, 0, 3], [1, 2, 2]])
out["embedding.ids"] = ids
case("embedding", lambda w: F.embedding(ids, w), torch.randn(4, 5))
save_file({k: v.contiguous() for k, v in out.items()}, "tests/data/torch_transformer.safetensors")
print(f"wrote {len(out)} tensors")

# Recurrent and transformer layers: tests/data/torch_layers.safetensors (its own seed, so the
# files above do not change when this section does).
torch.manual_seed(100)
out = {}


def recurrent(name, module, x, state):
    """The module's outputs for x from state, and the gradients of a random weighting of
    them with respect to x, the state and every parameter, all float64."""
    module = module.double()
    x = x.double().requires_grad_(True)
    state = tuple(s.double().requires_grad_(True) for s in state)
    arg = state if len(state) == 2 else state[0]
    y, final = module(x, arg)
    final = final if isinstance(final, tuple) else (final,)
    rs = [torch.randn_like(t) for t in (y, *final)]
    loss = sum((t * r).sum() for t, r in zip((y, *final), rs))
    named = list(module.named_parameters())
    grads = torch.autograd.grad(loss, [x, *state] + [p_ for _, p_ in named])
    out[f"{name}.x"], out[f"{name}.out"] = x.detach(), y.detach()
    for i, (s, f, r) in enumerate(zip(state, final, rs[1:])):
        out[f"{name}.state{i}"], out[f"{name}.final{i}"], out[f"{name}.r_final{i}"] = s.detach(), f.detach(), r
    out[f"{name}.r_out"], out[f"{name}.grad_x"] = rs[0], grads[0]
    for i in range(len(state)):
        out[f"{name}.grad_state{i}"] = grads[1 + i]
    for (n, p_), g in zip(named, grads[1 + len(state):]):
        out[f"{name}.param.{n}"], out[f"{name}.grad.{n}"] = p_.detach().clone(), g


recurrent("lstm", torch.nn.LSTM(5, 6, num_layers=2, bidirectional=True, batch_first=True),
          torch.randn(3, 4, 5), (torch.randn(4, 3, 6), torch.randn(4, 3, 6)))
recurrent("gru", torch.nn.GRU(5, 6), torch.randn(4, 3, 5), (torch.randn(1, 3, 6),))
recurrent("rnn_relu", torch.nn.RNN(5, 6, num_layers=2, nonlinearity="relu", bias=False),
          torch.randn(4, 5), (torch.randn(2, 6),))


def layer(name, module, inputs, call):
    """`call(module, *inputs)`'s output and its gradients (of a random weighting) with respect
    to the float inputs and every parameter, the parameters drawn wider than PyTorch's
    initialisation so that every term matters, all float64."""
    module = module.double()
    with torch.no_grad():
        for p_ in module.parameters():
            p_.copy_(torch.randn_like(p_) * 0.4)
    xs = [t.double().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    y = call(module, *xs)
    r = torch.randn_like(y)
    named = list(module.named_parameters())
    floats = [x for x in xs if x.is_floating_point()]
    grads = torch.autograd.grad((y * r).sum(), floats + [p_ for _, p_ in named])
    for i, x in enumerate(xs):
        out[f"{name}.in{i}"] = x.detach().clone()
    out[f"{name}.out"], out[f"{name}.r"] = y.detach(), r
    for i, g in enumerate(grads[:len(floats)]):
        out[f"{name}.grad_in{i}"] = g
    for (n, p_), g in zip(named, grads[len(floats):]):
        out[f"{name}.param.{n}"], out[f"{name}.grad.{n}"] = p_.detach().clone(), g


padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
layer("encoder", torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True),
      [torch.randn(2, 5, 8), padding], lambda m, x, kpm: m(x, src_key_padding_mask=kpm))
causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
layer("encoder_prenorm", torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, norm_first=True),
      [torch.randn(5, 2, 8), causal], lambda m, x, mask: m(x, src_mask=mask))
layer("decoder", torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
      [torch.randn(2, 5, 8), torch.randn(2, 6, 8), causal,
       torch.tensor([[False] * 6, [False, False, True, True, True, True]])],
      lambda m, t, mem, mask, kpm: m(t, mem, tgt_mask=mask, memory_key_padding_mask=kpm))
# Sequence pooling, instance norm, bilinear.
seq = torch.randn(2, 3, 11)
case("max_pool1d", lambda x: F.max_pool1d(x, 3, 2, 1, dilation=2, ceil_mode=True), seq)
case("avg_pool1d", lambda x: F.avg_pool1d(x, 4, 3, 2, ceil_mode=True, count_include_pad=False), seq)
case("adaptive_avg_pool1d", lambda x: F.adaptive_avg_pool1d(x, 4), seq)
case("instance_norm", lambda x, w, b: F.instance_norm(x, weight=w, bias=b, eps=1e-5),
     torch.randn(2, 3, 4, 5), torch.randn(3), torch.randn(3))
case("bilinear", lambda a, b, w, bias: F.bilinear(a, b, w, bias),
     torch.randn(2, 3, 4), torch.randn(2, 3, 5), torch.randn(6, 4, 5), torch.randn(6))
# Spatial transformers: an affine grid, and bilinear sampling at a grid reaching outside.
theta = torch.tensor([[[0.9, -0.3, 0.1], [0.2, 1.1, -0.2]], [[1.3, 0.4, 0.3], [-0.5, 0.7, 0.4]]])
for ac in (False, True):
    case(f"affine_grid_{ac}", lambda t, ac=ac: F.affine_grid(t, [2, 3, 4, 5], align_corners=ac), theta)
    case(f"grid_sample_{ac}", lambda x, g, ac=ac: F.grid_sample(x, g, mode="bilinear", padding_mode="zeros", align_corners=ac),
         torch.randn(2, 3, 4, 5), torch.rand(2, 6, 7, 2) * 2.6 - 1.3)
# Bags of embeddings: offsets with an empty bag, per-sample weights, fixed-length bags.
bag_ids = torch.tensor([4, 0, 2, 2, 5, 1, 3])
bag_offsets = torch.tensor([0, 3, 3, 5])
out["embedding_bag.ids"], out["embedding_bag.offsets"] = bag_ids, bag_offsets
table = torch.randn(6, 3)
for mode in ("sum", "mean", "max"):
    case(f"embedding_bag_{mode}", lambda w, mode=mode: F.embedding_bag(bag_ids, w, bag_offsets, mode=mode), table)
case("embedding_bag_weighted", lambda w, p: F.embedding_bag(bag_ids, w, bag_offsets, mode="sum", per_sample_weights=p),
     table, torch.randn(7))
out["embedding_bag_2d.ids"] = bag_ids[:6].reshape(2, 3).clone()
case("embedding_bag_2d", lambda w: F.embedding_bag(bag_ids[:6].reshape(2, 3), w, mode="mean"), table)
layer("transformer", torch.nn.Transformer(8, 2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=16, dropout=0.0),
      [torch.randn(6, 2, 8), torch.randn(5, 2, 8), causal],
      lambda m, src, tgt, mask: m(src, tgt, tgt_mask=mask))
case("conv_transpose1d", lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, padding=1, output_padding=1, groups=2, dilation=2),
     torch.randn(2, 4, 6), torch.randn(4, 3, 3), torch.randn(6))
save_file({k: v.contiguous() for k, v in out.items()}, "tests/data/torch_layers.safetensors")
print(f"wrote {len(out)} tensors")

# Dense linear algebra: tests/data/torch_linalg.safetensors (its own seed). Inputs are made
# well-posed inside each case (a positive-definite A Aᵀ + 4I, a triangle with 3 added to its
# diagonal), so kiln's test builds the same matrices from the same inputs and the gradients
# are those of the raw inputs.
torch.manual_seed(200)
out = {}
eye = torch.eye(5, dtype=torch.float64)
spd = lambda a: a @ a.mT + 4 * eye
case("cholesky", lambda a: torch.linalg.cholesky(spd(a)), torch.randn(3, 5, 5))
case("cholesky_upper", lambda a: torch.linalg.cholesky(spd(a), upper=True), torch.randn(5, 5))
case("solve", lambda a, b: torch.linalg.solve(a + 3 * eye, b), torch.randn(2, 5, 5), torch.randn(2, 5, 3))
case("solve_vector", lambda a, b: torch.linalg.solve(a + 3 * eye, b), torch.randn(5, 5), torch.randn(5))
case("solve_broadcast", lambda a, b: torch.linalg.solve(a + 3 * eye, b), torch.randn(5, 5), torch.randn(4, 5, 2))
case("solve_lower", lambda a, b: torch.linalg.solve_triangular(a.tril() + 3 * eye, b, upper=False),
     torch.randn(2, 5, 5), torch.randn(2, 5, 3))
case("solve_upper", lambda a, b: torch.linalg.solve_triangular(a.triu() + 3 * eye, b, upper=True),
     torch.randn(2, 5, 5), torch.randn(2, 5, 3))
case("inv", lambda a: torch.linalg.inv(a + 3 * eye), torch.randn(3, 5, 5))
case("det", lambda a: torch.linalg.det(a), torch.randn(4, 5, 5))
case("logabsdet", lambda a: torch.linalg.slogdet(a)[1], torch.randn(4, 5, 5))
out["logabsdet.sign"] = torch.linalg.slogdet(out["logabsdet.in0"])[0]
# Eigenvectors' signs are not unique: the values and the squared vectors are.
def eigh_invariant(a):
    values, vectors = torch.linalg.eigh(a + a.mT)
    return torch.cat([values, (vectors * vectors).flatten(-2)], -1)
case("eigh", eigh_invariant, torch.randn(3, 5, 5))
# So are a QR factor's: a column of Q and the row of R beside it may change sign together.
def qr_invariant(a):
    q, r = torch.linalg.qr(a)
    return torch.cat([(q * q).flatten(-2), (r * r).flatten(-2)], -1)
case("qr", qr_invariant, torch.randn(2, 6, 4))
case("qr_square", qr_invariant, torch.randn(5, 5))
# Ill-conditioned: a 6 × 6 Hilbert matrix (condition number about 1.5e7) plus a small
# random perturbation, solved and inverted.
hilbert = 1.0 / (torch.arange(6, dtype=torch.float64)[:, None] + torch.arange(6, dtype=torch.float64) + 1)
case("solve_ill", lambda a, b: torch.linalg.solve(hilbert + 1e-9 * a, b), torch.randn(6, 6), torch.randn(6, 2))
case("inv_ill", lambda a: torch.linalg.inv(hilbert + 1e-9 * a), torch.randn(6, 6))
out["hilbert"] = hilbert
def svd_invariant(a):
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    return torch.cat([s, (u * u).flatten(-2), (vh * vh).flatten(-2)], -1)
case("svd_tall", svd_invariant, torch.randn(2, 6, 4))
case("svd_wide", svd_invariant, torch.randn(4, 6))
# Compositions: norms, cross, vecdot, multi_dot, matrix_power, pinv, cond, eigvalsh, vander.
case("vector_norm2", lambda x: torch.linalg.vector_norm(x, 2, dim=(-1,)), torch.randn(3, 7))
case("vector_norm3", lambda x: torch.linalg.vector_norm(x, 3.0, dim=(0, 2), keepdim=True), torch.randn(3, 4, 5))
case("vector_norm_inf", lambda x: torch.linalg.vector_norm(x, float("inf")), torch.randn(4, 5))
case("vector_norm1", lambda x: torch.linalg.vector_norm(x, 1, dim=(1,)), torch.randn(4, 5))
for name, ord_ in [("fro", "fro"), ("nuc", "nuc"), ("2", 2), ("m2", -2), ("1", 1), ("m1", -1), ("inf", float("inf")), ("minf", float("-inf"))]:
    case(f"matrix_norm_{name}", lambda a, o=ord_: torch.linalg.matrix_norm(a, o), torch.randn(2, 4, 3))
case("cross", lambda a, b: torch.linalg.cross(a, b), torch.randn(4, 3), torch.randn(1, 3))
case("vecdot", lambda a, b: torch.linalg.vecdot(a, b, dim=-1), torch.randn(3, 5), torch.randn(3, 5))
case("multi_dot", lambda a, b, c: torch.linalg.multi_dot([a, b, c]), torch.randn(3, 4), torch.randn(4, 5), torch.randn(5, 2))
case("matrix_power3", lambda a: torch.linalg.matrix_power(a, 3), torch.randn(2, 4, 4))
case("matrix_power_m2", lambda a: torch.linalg.matrix_power(a + 3 * torch.eye(4, dtype=torch.float64), -2), torch.randn(4, 4))
case("pinv", lambda a: torch.linalg.pinv(a), torch.randn(2, 5, 3))
case("cond", lambda a: torch.linalg.cond(a), torch.randn(3, 4, 4))
case("eigvalsh", lambda a: torch.linalg.eigvalsh(a + a.mT), torch.randn(2, 5, 5))
case("vander", lambda x: torch.linalg.vander(x, N=4), torch.randn(2, 5))
case("lstsq", lambda a, b: torch.linalg.lstsq(a, b).solution, torch.randn(2, 7, 4), torch.randn(2, 7, 3))
case("qr_wide", qr_invariant, torch.randn(2, 4, 6))
save_file({k: v.contiguous() for k, v in out.items()}, "tests/data/torch_linalg.safetensors")
print(f"wrote {len(out)} tensors")

# The everyday vocabulary: tests/data/torch_vocabulary.safetensors (its own seed). Inputs
# hold the domain edges (±0, ±inf, NaN, poles, ties); `values` records results without
# gradients (integer ops, indices), `case` values and gradients.
torch.manual_seed(300)
out = {}


def values(name, fn, *inputs):
    for i, x in enumerate(inputs):
        out[f"{name}.in{i}"] = x.clone().contiguous()
    y = fn(*inputs)
    for i, t in enumerate(y if isinstance(y, tuple) else (y,)):
        out[f"{name}.out{i}"] = t.contiguous()


d = lambda *v: torch.tensor(v, dtype=torch.float64)
inf, nan = float("inf"), float("nan")
case("erfc", torch.erfc, torch.cat([torch.randn(40) * 3, d(0.0, -0.0, 26.0, -30.0, 5.5, 0.4)]))
values("erfc_edges", torch.erfc, d(inf, -inf, nan, 27.3, -0.0))
case("erfinv", torch.erfinv, torch.cat([torch.rand(40) * 2 - 1, d(0.0, 0.999999, -(1 - 1e-12), 1e-300, 0.5)]))
values("erfinv_edges", torch.erfinv, d(1.0, -1.0, 1.5, -2.0, nan, -0.0, 1 - 1e-16))
numer = torch.cat([torch.randn(30) * 10, d(7.5, -7.5, 7.5, -7.5, 1e10, -1e-3, 0.0, -0.0, 5.0, inf, 3.0, nan, 1e300)])
denom = torch.cat([torch.randn(30) * 3, d(2.0, 2.0, -2.0, -2.0, 3.0, 2.0, 3.0, -3.0, 0.0, 2.0, inf, 1.0, 3.0)])
values("fmod", torch.fmod, numer, denom)
values("remainder", torch.remainder, numer, denom)
values("floor_divide", torch.floor_divide, numer, denom)
values("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), numer, denom)
smooth_a, smooth_b = torch.randn(20) * 10, torch.randn(20) * 3 + 0.5
case("fmod_grad", torch.fmod, smooth_a, smooth_b)
case("remainder_grad", torch.remainder, smooth_a, smooth_b)
ia = torch.cat([torch.randint(-50, 50, (30,)), torch.tensor([7, -7, 7, -7, 0, -2**63])])
ib = torch.cat([torch.randint(1, 8, (30,)) * torch.randint(0, 2, (30,)).mul(2).sub(1), torch.tensor([2, 2, -2, -2, 3, 3])])
for dtype in (torch.int64, torch.int32):
    n = "i64" if dtype == torch.int64 else "i32"
    a, b = ia.to(dtype), ib.to(dtype)
    if dtype == torch.int32:
        a[-1] = -2**31
    values(f"int_fmod_{n}", torch.fmod, a, b)
    values(f"int_remainder_{n}", torch.remainder, a, b)
    values(f"int_floor_divide_{n}", torch.floor_divide, a, b)
    values(f"int_div_trunc_{n}", lambda a, b: torch.div(a, b, rounding_mode="trunc"), a, b)
bits = torch.cat([torch.randint(-2**40, 2**40, (20,)), torch.tensor([0, -1, 2**62, -2**63])])
other = torch.cat([torch.randint(-2**40, 2**40, (20,)), torch.tensor([5, -1, -2**62, 3])])
shifts = torch.cat([torch.randint(0, 70, (20,)), torch.tensor([0, 63, 64, 100])])
for dtype, n in ((torch.int64, "i64"), (torch.int32, "i32"), (torch.uint8, "u8")):
    a, b = bits.to(dtype), other.to(dtype)
    s = shifts.clamp(max=200).to(dtype)
    values(f"bitwise_{n}", lambda a, b, s: (a & b, a | b, a ^ b, ~a, a << s, a >> s), a, b, s)
# Scans and counts along a dimension.
lse_in = torch.randn(3, 7) * 4
lse_in[0] = d(-1000.0, 0.0, -1e3, 5.0, -inf, 2.0, 700.0)
case("logcumsumexp1", lambda x: torch.logcumsumexp(x, 1), lse_in[1:])
values("logcumsumexp_edges", lambda x: torch.logcumsumexp(x, 1), lse_in)
case("logcumsumexp0", lambda x: torch.logcumsumexp(x, 0), torch.randn(5, 3))
ties = d(1.0, 3.0, 3.0, nan, 2.0, nan, -1.0, 0.0, 0.0)
values("cummax", lambda x: torch.cummax(x, 0), ties)
values("cummin", lambda x: torch.cummin(x, 0), ties)
case("cummax_grad", lambda x: torch.cummax(x, 1)[0], torch.randn(3, 6))
modes = torch.tensor([[2, 2, 1, 1, 1, 2], [3, 1, 3, 1, 2, 0], [5, 5, 5, 5, 5, 5], [4, 0, 4, 0, 9, 9]])
values("mode_int", lambda x: torch.mode(x, 1), modes)
values("mode_dim0", lambda x: torch.mode(x, 0), modes)
values("mode_float", lambda x: torch.mode(x, 1), d(5.0, nan, nan, 1.0, 1.0, 5.0).reshape(1, 6))
case("mode_grad", lambda x: torch.mode(x, 1)[0], modes.double() + torch.randn(4, 6) * 0)
# scatter_reduce: every reduction, with and without self.
sr_index = torch.randint(0, 5, (3, 4))
out["scatter_reduce.index"] = sr_index
for how in ("sum", "prod", "mean", "amax", "amin"):
    for inc in (True, False):
        case(f"scatter_reduce_{how}_{inc}",
             lambda s, src, how=how, inc=inc: s.scatter_reduce(1, sr_index, src, reduce=how, include_self=inc),
             torch.randn(3, 5), torch.randn(3, 4))
tie_index = torch.tensor([[0, 0, 1, 1]])
out["scatter_reduce_ties.index"] = tie_index
case("scatter_reduce_ties", lambda s, src: s.scatter_reduce(1, tie_index, src, reduce="amax"),
     d(2.0, 1.0).reshape(1, 2), d(2.0, 2.0, 0.5, 1.0).reshape(1, 4))
# CTC: PyTorch's gradient for log-probabilities, and for logits through log_softmax.
ctc_targets = torch.tensor([[1, 2, 2, 3], [4, 1, 0, 0], [3, 3, 1, 0]])
out["ctc.targets"] = ctc_targets
ctc_in, ctc_tg = [12, 10, 7], [4, 2, 3]
logits = torch.randn(12, 3, 5)
case("ctc_logits", lambda x: F.ctc_loss(x.log_softmax(2), ctc_targets, ctc_in, ctc_tg), logits)
case("ctc_log_probs", lambda lp: F.ctc_loss(lp, ctc_targets, ctc_in, ctc_tg, reduction="none"),
     logits.log_softmax(2))
case("ctc_sum_blank", lambda x: F.ctc_loss(x.log_softmax(2), ctc_targets + 1, ctc_in, ctc_tg, blank=0, reduction="sum"),
     torch.randn(12, 3, 6))
case("ctc_zero_infinity", lambda x: F.ctc_loss(x.log_softmax(2), ctc_targets, [12, 3, 7], ctc_tg, reduction="none", zero_infinity=True),
     logits)
# Volumes and the 1-d and 3-d pools.
vol = torch.randn(2, 4, 5, 6, 7)
case("conv3d", lambda x, w, b: F.conv3d(x, w, b, stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1), groups=2),
     vol, torch.randn(6, 2, 3, 2, 3), torch.randn(6))
case("max_pool3d", lambda x: F.max_pool3d(x, (3, 2, 3), (2, 2, 1), (1, 1, 1), dilation=(1, 1, 2), ceil_mode=True), vol)
case("avg_pool3d", lambda x: F.avg_pool3d(x, (3, 3, 2), (2, 2, 2), (1, 1, 0), ceil_mode=True, count_include_pad=False), vol)
case("avg_pool3d_pad", lambda x: F.avg_pool3d(x, 3, 2, 1), vol)
case("adaptive_avg_pool3d", lambda x: F.adaptive_avg_pool3d(x, (2, 4, 3)), vol)
case("adaptive_max_pool3d", lambda x: F.adaptive_max_pool3d(x, (2, 4, 3)), vol)
case("adaptive_max_pool1d", lambda x: F.adaptive_max_pool1d(x, 4), torch.randn(2, 3, 11))
case("instance_norm3d", lambda x: F.instance_norm(x, eps=1e-5), vol)
# The remaining pointwise activations, with values far out on both sides.
act = torch.cat([torch.randn(40) * 4, d(30.0, -30.0, 100.0, -100.0, 1000.0, -1000.0)])
for name, fn in [("relu6", F.relu6), ("hardtanh", lambda x: F.hardtanh(x, -2.0, 1.5)),
                 ("hardsigmoid", F.hardsigmoid), ("hardswish", F.hardswish), ("mish", F.mish),
                 ("selu", F.selu), ("celu", lambda x: F.celu(x, 0.7)), ("logsigmoid", F.logsigmoid),
                 ("softsign", F.softsign), ("softshrink", lambda x: F.softshrink(x, 0.6)),
                 ("hardshrink", lambda x: F.hardshrink(x, 0.6)), ("tanhshrink", F.tanhshrink),
                 ("threshold", lambda x: F.threshold(x, 0.3, -2.0))]:
    case(f"act_{name}", fn, act)
case("softmin", lambda x: F.softmin(x, dim=1), torch.randn(4, 7))
case("glu", lambda x: F.glu(x, dim=1), torch.randn(3, 8, 2))
case("prelu", F.prelu, torch.randn(2, 3, 5), torch.rand(3))
case("linear", F.linear, torch.randn(4, 5), torch.randn(3, 5), torch.randn(3))
save_file({k: v.contiguous() for k, v in out.items()}, "tests/data/torch_vocabulary.safetensors")
print(f"wrote {len(out)} tensors")
