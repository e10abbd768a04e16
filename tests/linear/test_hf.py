"""softmaxkit_linear_<method>: a tiny Llama (built from its config, no downloads) trains,
and greedy decoding through the Hugging Face cache with the recurrent state equals the
full causal pass."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import softmaxkit as sk

CAUSAL = [spec.name for spec in sk.linear.methods() if spec.causal]


def _llama(impl):
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=impl)


def test_register_names_the_causal_methods():
    names = sk.hf.register()
    assert [n for n in names if n.startswith(sk.hf.LINEAR_PREFIX)] == [f"softmaxkit_linear_{m}" for m in CAUSAL]
    assert "softmaxkit_linear_soft" not in names


@pytest.mark.parametrize("method", CAUSAL)
def test_train_and_decode_through_the_cache(method):
    sk.hf.register()
    model = _llama(f"softmaxkit_linear_{method}")
    ids = torch.randint(3, 32, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :2] = 0   # left padding
    out = model(ids, attention_mask=mask, labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss) and all(torch.isfinite(p.grad).all() for p in model.parameters()
                                            if p.grad is not None)
    model.zero_grad()
    with torch.no_grad():
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
        layer = model.model.layers[0].self_attn
        assert layer._softmaxkit_linear_state[0].position == 9 + 5   # the state followed the cache
        full_mask = torch.cat([mask, torch.ones(2, 6, dtype=torch.long)], 1)
        positions = (full_mask.cumsum(-1) - 1).clamp_min(0)         # as generate() numbers them
        full = model(gen.sequences, attention_mask=full_mask, position_ids=positions,
                     use_cache=False).logits                         # no cache: one causal pass
    step_logits = torch.stack(gen.logits, 1)
    torch.testing.assert_close(step_logits, full[:, 8:14], rtol=1e-4, atol=1e-4)
    nocache = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(nocache, gen.sequences)


def test_two_caches_used_in_turn_keep_their_own_states():
    """Two prompts of one length ending in the same token, decoded in turn through their own
    caches: the first layer's keys (rotary positions) end alike, and the state of the other
    prompt was taken (logits 0.13 off). Each step now equals its prompt's full pass."""
    sk.hf.register()
    model = _llama("softmaxkit_linear_linear")
    a, b = torch.tensor([[5, 6, 7, 9]]), torch.tensor([[8, 4, 3, 9]])
    with torch.no_grad():
        cache_a, cache_b = transformers.DynamicCache(), transformers.DynamicCache()
        model(a, past_key_values=cache_a)
        model(b, past_key_values=cache_b)
        step = model(torch.tensor([[11]]), past_key_values=cache_a).logits[0, -1]
        full = model(torch.cat([a, torch.tensor([[11]])], 1), use_cache=False).logits[0, -1]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
