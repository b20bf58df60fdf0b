"""The reference EAGLE-3 forward (training and offline evaluation) against a naive step-by-step decode."""
import torch

from infra.engine_side import eagle3_ref
from infra.engine_side.offline_eval import prefix_rates

CFG = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24,
       "rms_norm_eps": 1e-6, "vocab_size": 40, "draft_vocab_size": 40, "rope_theta": 10000.0,
       "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}


def tiny():
    torch.manual_seed(0)
    d = eagle3_ref.Eagle3(CFG, torch.randn(40, 16))
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return d.eval()


def naive_chain(d, aux, ids, t, steps):
    """What vLLM does at one slot t: step 1 over positions 0..t (its KV cache), then steps 2.. one token at a time,
    each attending to that cache plus its own earlier draft steps."""
    att, m = d.midlayer.self_attn, d.midlayer
    h = d.fc(aux[: t + 1])
    toks = ids[1: t + 2]
    keys, vals, logits = [], [], []
    for j in range(steps):
        x = torch.cat([m.input_layernorm(d.embed[toks]), m.hidden_norm(h)], -1)
        pos = torch.arange(len(toks)) + (0 if j == 0 else t + j)
        q = att._rope(att.q_proj(x).view(len(toks), att.heads, -1), pos)
        k = att._rope(att.k_proj(x).view(len(toks), att.kv_heads, -1), pos)
        keys.append(k.repeat_interleave(2, 1))
        vals.append(att.v_proj(x).view(len(toks), att.kv_heads, -1).repeat_interleave(2, 1))
        K, V = torch.cat(keys), torch.cat(vals)
        qi = q[-1]  # the query at slot t
        w = torch.softmax(torch.einsum("hd,shd->hs", qi, K) * att.head_dim ** -0.5, -1)
        o = att.o_proj(torch.einsum("hs,shd->hd", w, V).reshape(1, -1))
        resid = o + h[-1:]
        pre = m.mlp(m.post_attention_layernorm(resid)) + resid
        logits.append(d.lm_head(d.norm(pre))[0])
        h, toks = pre, ids[t + 2 + j: t + 3 + j]  # next step: own pre-norm output, next (teacher) token
    return logits


def test_vectorised_chain_equals_a_naive_decode_at_every_slot():
    d = tiny()
    aux, ids = torch.randn(12, 48), torch.randint(0, 40, (12,))
    with torch.no_grad():
        steps = d.chain_logits(aux, ids, 3)
        for t in (0, 4, 7):
            naive = naive_chain(d, aux, ids, t, 3)
            for j in range(3):
                torch.testing.assert_close(steps[j][t], naive[j], atol=1e-5, rtol=1e-4)


def test_a_slot_never_sees_the_future():
    d = tiny()
    aux, ids = torch.randn(12, 48), torch.randint(0, 40, (12,))
    aux2, ids2 = aux.clone(), ids.clone()
    aux2[6:] += 1.0  # change everything after slot 5 and after the tokens its 3 steps read (ids[..8])
    ids2[9:] = (ids2[9:] + 1) % 40
    with torch.no_grad():
        a, b = d.chain_logits(aux, ids, 3), d.chain_logits(aux2, ids2, 3)
    for j in range(3):
        torch.testing.assert_close(a[j][:6], b[j][:6])
    assert not torch.allclose(a[0][6], b[0][6])


def test_d2t_maps_draft_ids_to_target_ids():
    d = tiny()
    d.d2t[:] = 3
    assert d.to_target(torch.tensor([0, 5])).tolist() == [3, 8]


def test_prefix_rates_count_a_position_only_when_all_earlier_drafts_were_right():
    correct = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    assert prefix_rates(correct) == [0.75, 0.5, 0.25]


D2T = torch.tensor([1] + [0] * 39)  # draft id 0 serves target id 1


def _formats(tmp_path, d):
    """One trained head saved as SpecForge, speculators and the EAGLE repo save theirs (tests/fixtures/formats.py
    cites each layout), with the same weights."""
    from tests.fixtures import formats as F

    sd = {k: v for k, v in d.state_dict().items() if k not in ("embed",)}
    sd["d2t"] = D2T
    common = {k: CFG[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                                  "rms_norm_eps", "vocab_size", "draft_vocab_size", "rope_theta")}
    aux = {"eagle_aux_hidden_state_layer_ids": CFG["eagle_aux_hidden_state_layer_ids"]}
    eng = lambda k: k.replace("midlayer.", "layers.0.")  # noqa: E731
    return {
        "specforge": F._save(tmp_path / "sf", {"architectures": ["LlamaForCausalLMEagle3"], **common,
                                               "eagle_config": aux}, sd),
        "speculators": F._save(tmp_path / "sp", {"architectures": ["Eagle3Speculator"],
                                                 "speculators_model_type": "eagle3",
                                                 "speculators_config": {"algorithm": "eagle3"},
                                                 "transformer_layer_config": common, **aux,
                                                 "draft_vocab_size": 40, "target_hidden_size": None,
                                                 "norm_before_residual": False}, sd, rename=eng, fmt="sharded"),
        "eagle-repo": F._save(tmp_path / "er", {"architectures": ["LlamaForCausalLM"], **common, **aux,
                                                "num_hidden_layers": 1}, sd, fmt="bin"),
    }


def test_the_offline_reference_reads_every_llama_head_format_from_its_description(tmp_path):
    """offline_eval builds the head from infra/checkpoints' normalised description (engine names, byte offsets):
    the same weights in any public layout give the same draft logits."""
    from infra.checkpoints import TargetSpec, read_drafter
    from infra.engine_side.offline_eval import read_ref
    from infra.executor import LocalExecutor
    from infra.arms import Arm
    from infra.config import DrafterConfig
    from tasks.offline import describe

    d, target = tiny(), TargetSpec("t", ["LlamaForCausalLM"], "llama", 16, 40, 6, 2048, False)
    aux, ids = torch.randn(12, 48), torch.randint(0, 40, (12,))
    with torch.no_grad():
        want = d.chain_logits(aux, ids, 2)
    for fmt, path in _formats(tmp_path, d).items():
        drafter = read_drafter(LocalExecutor(), str(path))
        assert drafter.format == fmt
        arm = Arm(fmt, "candidate", fmt, DrafterConfig(method="eagle3", model=str(path)))
        spec = describe(arm, drafter, target)
        rebuilt = eagle3_ref.build(spec["config"], {k: read_ref(r) for k, r in spec["tensors"].items()}, d.embed, fmt)
        with torch.no_grad():
            for a, b in zip(rebuilt.chain_logits(aux, ids, 2), want):
                torch.testing.assert_close(a, b, msg=fmt)
        assert torch.equal(rebuilt.d2t, D2T), fmt
