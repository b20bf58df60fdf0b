"""A reference forward of an EAGLE-3 drafter (Llama midlayer), following vLLM 0.32's conventions exactly.

Read from `vllm/model_executor/models/llama_eagle3.py` and `v1/spec_decode/llm_base_proposer.py`:
- the target's aux hidden state at position t is `output_hidden_states[k]` of transformers for each aux id k
  (the input of layer k), concatenated in sorted order and projected by `fc` (3H -> H);
- slot t takes (aux[t], token t+1, position t) and predicts token t+2; draft step j > 1 at slot t feeds back the
  previous step's pre-norm output, the drafted token and position t+j-1;
- midlayer: q/k/v read cat([input_layernorm(embed), hidden_norm(h)]); raw h is the residual; the final norm's
  normed output gives logits over the draft vocab, mapped to target ids as i + d2t[i].
Attention of step j at slot t sees step 1's keys at positions <= t and its own chain's keys of steps 2..j: what
vLLM's KV cache holds at that moment (and what EAGLE-3's test-time training trains on).

Not `speculators`' model: it needs torchvision/torchaudio (CUDA builds that break this CPU torch) and flex
attention; this file is small, CPU-friendly and used for both training the demo drafter and offline evaluation.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x).to(dtype)


class _Attention(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        h, self.heads, self.kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or h // self.heads
        self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim),
                             persistent=False)

    def _rope(self, x, positions):  # x [T, n, d]
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None, :], torch.cat([freqs, freqs], -1).sin()[:, None, :]
        x1, x2 = x[..., : self.head_dim // 2], x[..., self.head_dim // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, x, positions, chain: list):
        """x [T, 2H]. chain: (K, V) of the earlier steps, step 1 first; this step's (K, V) is appended."""
        t = x.shape[0]
        q = self._rope(self.q_proj(x).view(t, self.heads, self.head_dim), positions)
        k = self._rope(self.k_proj(x).view(t, self.kv_heads, self.head_dim), positions)
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        chain.append((k, v))
        rep = self.heads // self.kv_heads
        ks = [c[0].repeat_interleave(rep, 1) for c in chain]  # [T, heads, d] each
        vs = [c[1].repeat_interleave(rep, 1) for c in chain]
        scale = self.head_dim ** -0.5
        causal = torch.einsum("thd,shd->hts", q, ks[0]) * scale  # step 1's keys, positions <= t
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        causal = causal.masked_fill(~mask, float("-inf"))
        diag = [torch.einsum("thd,thd->ht", q, k_)[..., None] * scale for k_ in ks[1:]]  # own chain, slot t only
        probs = torch.softmax(torch.cat([causal, *diag], -1).float(), -1).to(q.dtype)
        out = torch.einsum("hts,shd->thd", probs[..., :t], vs[0])
        for i, v_ in enumerate(vs[1:]):
            out = out + probs[..., t + i].transpose(0, 1)[..., None] * v_
        return self.o_proj(out.reshape(t, -1))


class _Mlp(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Midlayer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.self_attn, self.mlp = _Attention(cfg), _Mlp(cfg)


class Eagle3(nn.Module):
    """State-dict names are the checkpoint's (fc, midlayer.*, norm, lm_head, d2t, t2d)."""

    def __init__(self, cfg: dict, embed: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        h, n_aux = cfg["hidden_size"], len(cfg["eagle_aux_hidden_state_layer_ids"])
        th = cfg.get("target_hidden_size") or h
        self.n_aux = n_aux
        self.fc = nn.Linear(n_aux * th, h, bias=False)
        if cfg.get("norm_before_fc"):  # one norm over the concatenated aux states
            self.input_norm = RMSNorm(n_aux * th, cfg["rms_norm_eps"])
        if cfg.get("fc_norm"):  # one norm per aux state
            self.fc_norm = nn.ModuleList(RMSNorm(th, cfg["rms_norm_eps"]) for _ in range(n_aux))
        self.midlayer = _Midlayer(cfg)
        self.norm = RMSNorm(h, cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(h, cfg["draft_vocab_size"], bias=False)
        self.register_buffer("embed", embed, persistent=False)  # the target's, frozen (shared, as in vLLM)
        self.register_buffer("d2t", torch.zeros(cfg["draft_vocab_size"], dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg["vocab_size"], dtype=torch.bool))

    @property
    def aux_layers(self) -> list[int]:
        return sorted(set(self.cfg["eagle_aux_hidden_state_layer_ids"]))

    def step(self, h, tokens, positions, chain):
        """One draft step for all slots: h [T, H], tokens [T] -> (pre-norm h [T, H], draft logits [T, V_draft])."""
        m = self.midlayer
        normed = m.hidden_norm(h)
        x = torch.cat([m.input_layernorm(self.embed[tokens]), normed], -1)
        resid = m.self_attn(x, positions, chain) + (normed if self.cfg.get("norm_before_residual") else h)
        pre = m.mlp(m.post_attention_layernorm(resid)) + resid
        out = self.norm(pre)
        return (out if self.cfg.get("norm_output") else pre), self.lm_head(out)

    def project(self, aux):
        """aux [T, n_aux*H_target] -> fc input, through the norms the config asks for (vLLM's combine_hidden_states)."""
        if self.cfg.get("norm_before_fc"):
            aux = self.input_norm(aux)
        if self.cfg.get("fc_norm"):
            aux = torch.cat([n(c) for n, c in zip(self.fc_norm, aux.chunk(self.n_aux, -1))], -1)
        return self.fc(aux)

    def chain_logits(self, aux, ids, steps: int) -> list[torch.Tensor]:
        """aux [L, n_aux*H] (target states at positions 0..L-1), ids [L] -> per step j, draft logits [L-1-j, V_draft]
        for slots t = 0..L-2-j; step j (0-based) at slot t predicts ids[t+j+2]. Inputs are teacher-forced: for the
        prefix acceptance that serving measures, later steps only count when earlier drafts were right anyway."""
        n = aux.shape[0] - 1
        h, chain, out = self.project(aux[:n]), [], []
        positions = torch.arange(n, device=aux.device)
        for j in range(steps):
            toks = ids[1 + j: 1 + j + n]
            if toks.shape[0] < n:  # the last slots run out of teacher tokens: pad; they are never scored
                toks = F.pad(toks, (0, n - toks.shape[0]))
            h, logits = self.step(h, toks, positions + j, chain)
            out.append(logits[: max(0, n - 1 - j)])
        return out

    def to_target(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]


def build(cfg: dict, tensors: dict[str, torch.Tensor], embed: torch.Tensor | None, where: str,
          dtype=torch.float32) -> Eagle3:
    """cfg: the flat config the engine builds the head from; tensors under checkpoint or engine names
    (`layers.0.*` is `midlayer.*`; `model.` dropped)."""
    cfg = dict(cfg)
    cfg.setdefault("draft_vocab_size", cfg["vocab_size"])
    tensors = {k.removeprefix("model.").replace("layers.0.", "midlayer."): v for k, v in tensors.items()}
    own = tensors.pop("embed_tokens.weight", None)  # a drafter with its own embedding uses it, as vLLM does
    if own is None and embed is None:
        raise ValueError(f"{where}: the head has no embed_tokens and the target's embedding was not found")
    model = Eagle3(cfg, (own if own is not None else embed).to(dtype))
    if "d2t" not in tensors:  # vLLM then maps draft id i to target id i
        tensors["d2t"] = torch.zeros(cfg["draft_vocab_size"], dtype=torch.long)
    tensors["d2t"] = tensors["d2t"].long()
    tensors.setdefault("t2d", torch.ones(cfg["vocab_size"], dtype=torch.bool))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"{where}: checkpoint does not match an EAGLE-3 Llama head (missing {missing}, "
                         f"unexpected {unexpected})")
    return model.to(dtype).eval()
