"""softmaxkit.hf: every normalizer runs a small random Llama and GPT-2 (no downloads)."""

import ast
import copy
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import softmaxkit as sk  # noqa: E402

NAMES = [spec.name for spec in sk.normalizers()]


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager")


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=32, n_embd=16, n_layer=2, n_head=2, n_positions=32,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model_and_batch(request):
    sk.hf.register()
    torch.manual_seed(0)
    model = _llama() if request.param == "llama" else _gpt2()
    ids = torch.randint(3, 32, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    return model, ids, mask


def test_register_names_every_normalizer():
    assert sk.hf.register()[:len(NAMES)] == [f"softmaxkit_{n}" for n in NAMES]


def test_softmax_logits_equal_eager(model_and_batch):
    model, ids, mask = model_and_batch
    model.set_attn_implementation("eager")
    eager = model(ids, attention_mask=mask).logits
    model.set_attn_implementation("softmaxkit_softmax")
    ours = model(ids, attention_mask=mask).logits
    visible = mask.bool()
    torch.testing.assert_close(ours[visible], eager[visible], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_forward_backward_generate(model_and_batch, name):
    model, ids, mask = model_and_batch
    model.set_attn_implementation(f"softmaxkit_{name}")
    model.zero_grad()
    out = model(ids, attention_mask=mask, labels=ids)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    generated = model.generate(ids[:1, :4], max_new_tokens=2, do_sample=False)
    assert generated.shape == (1, 6)


def test_normalizer_changes_the_logits(model_and_batch):
    model, ids, mask = model_and_batch
    model.set_attn_implementation("softmaxkit_softmax")
    softmax = model(ids).logits
    model.set_attn_implementation("softmaxkit_softpick")
    assert not torch.allclose(model(ids).logits, softmax)


def test_swap_puts_per_head_parameters_in_the_state_dict():
    torch.manual_seed(0)
    model = _llama()
    ids = torch.randint(3, 32, (1, 6))
    sk.hf.swap(model, "ssmax", s=0.5)
    assert model.config._attn_implementation == "softmaxkit_ssmax"
    keys = [k for k in model.state_dict() if k.endswith("softmaxkit_normalizer.s")]
    assert len(keys) == 2
    layer = model.model.layers[0].self_attn
    assert layer.softmaxkit_normalizer.s.shape == (4, 1, 1)
    model(ids, labels=ids).loss.backward()
    assert layer.softmaxkit_normalizer.s.grad.abs().sum() > 0
    before = model(ids).logits
    with torch.no_grad():
        layer.softmaxkit_normalizer.s.fill_(2.0)
    assert not torch.allclose(model(ids).logits, before)  # the layer uses its own parameters
    clone = _llama()
    sk.hf.swap(clone, "ssmax")
    clone.load_state_dict(model.state_dict())
    torch.testing.assert_close(clone(ids).logits, model(ids).logits)


def test_swap_sparse_softmax_with_k_and_default_k():
    model = _gpt2()
    ids = torch.randint(3, 32, (1, 12))
    model.set_attn_implementation(sk.hf.register()[NAMES.index("sparse_softmax")])
    default = model(ids).logits  # k = SPARSE_SOFTMAX_K
    sk.hf.swap(model, "sparse_softmax", k=2)
    assert not torch.allclose(model(ids).logits, default)
    with pytest.raises(ValueError, match="registered names"):
        sk.hf.swap(model, "nope")


def _eager_imports(node):
    """Modules imported by ``node`` outside function bodies (what runs at import time)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
        yield node.module or ""
    for child in ast.iter_child_nodes(node):
        yield from _eager_imports(child)


def test_transformers_is_imported_only_inside_functions():
    """``import softmaxkit`` must not import transformers: no import of it outside functions."""
    for path in Path(sk.__file__).parent.rglob("*.py"):
        modules = _eager_imports(ast.parse(path.read_text()))
        assert not any(m.split(".")[0] == "transformers" for m in modules), path
    assert list(_eager_imports(ast.parse("import transformers"))) == ["transformers"]
    assert not list(_eager_imports(ast.parse("def f():\n    import transformers")))


def test_streaming_path_inside_a_model_equals_the_dense_path(model_and_batch, monkeypatch, name="softpick"):
    from softmaxkit.attention import api

    model, ids, mask = model_and_batch
    model.set_attn_implementation(f"softmaxkit_{name}")
    dense = model(ids, attention_mask=mask).logits  # short inputs: the dense path
    monkeypatch.setattr(api, "SMALL_SCORES", 0)
    streamed = model(ids, attention_mask=mask).logits
    visible = mask.bool()
    torch.testing.assert_close(streamed[visible], dense[visible], rtol=0, atol=1e-5)


def test_swap_on_a_bert_style_model():
    """Audit 2026-12-02: swap looked for `head_dim`, which BERT's attention calls `attention_head_size`."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, attn_implementation="sdpa")
    model = BertModel._from_config(config).eval()
    ids = torch.randint(0, 100, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    sk.hf.swap(model, "softmax")
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).last_hidden_state, expected)
    sk.hf.swap(model, "ssmax")
    assert sum("softmaxkit_normalizer" in name for name, _ in model.named_parameters()) == 2
    before = model(input_ids=ids, attention_mask=mask).last_hidden_state
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "softmaxkit_normalizer" in name:
                p.fill_(2.0)
    assert not torch.allclose(model(input_ids=ids, attention_mask=mask).last_hidden_state, before)


def _logits(model, impl, ids, mask=None):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits if mask is not None else model(input_ids=ids).last_hidden_state


def test_t5_relative_position_bias_is_added_to_the_scores():
    """T5's ``position_bias`` (passed as a keyword) was dropped: the logits moved by 0.2."""
    sk.hf.register()
    torch.manual_seed(0)
    model = transformers.T5EncoderModel(transformers.T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32,
                                                              num_layers=1, num_heads=4)).eval()
    ids = torch.randint(3, 32, (1, 7))
    torch.testing.assert_close(_logits(model, "softmaxkit_softmax", ids), _logits(model, "eager", ids))


def test_gpt_oss_sinks_take_the_softmax_sink_normalizer():
    """gpt-oss's per-head sink logits (``s_aux``) were dropped; softmax_sink now takes them
    (equal to eager, left padding too), and another normalizer refuses them."""
    sk.hf.register()
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=4, num_local_experts=2,
                                    num_experts_per_tok=1, sliding_window=4, max_position_embeddings=32,
                                    layer_types=["sliding_attention", "full_attention"])
    model = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0, 2)
    ids = torch.randint(3, 32, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0
    got, want = _logits(model, "softmaxkit_softmax_sink", ids, mask), _logits(model, "eager", ids, mask)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1, 2:], want[1, 2:])
    with pytest.raises(ValueError, match="s_aux"):
        _logits(model, "softmaxkit_softmax", ids, mask)


def test_a_fixed_tensor_parameter_reaches_the_attention():
    """``swap(model, "softmax", temperature=torch.tensor(0.5))`` (and ``nn.Attention`` with a
    tensor temperature) kept the tensor as a buffer but never passed it: the logits were
    those of temperature 1."""
    torch.manual_seed(0)
    ids = torch.randint(3, 32, (1, 6))
    base = _llama()
    logits = []
    for temperature in (0.5, torch.tensor(0.5), 1.0):
        model = copy.deepcopy(base)
        sk.hf.swap(model, "softmax", temperature=temperature)
        logits.append(model(ids).logits)
    torch.testing.assert_close(logits[0], logits[1])
    assert not torch.allclose(logits[1], logits[2])
    torch.manual_seed(2)
    a = sk.nn.Attention(16, 4, "softmax", temperature=0.5)
    b = sk.nn.Attention(16, 4, "softmax", temperature=torch.tensor(0.5))
    b.load_state_dict(a.state_dict(), strict=False)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(a(x), b(x))
