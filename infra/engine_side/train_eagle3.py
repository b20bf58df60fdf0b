"""Train the demo EAGLE-3 drafter for SmolLM2 on 2 CPU cores, in minutes. Run by the engine virtualenv's Python.

Usage: python train_eagle3.py TARGET_DIR OUT_DIR [--prompts N] [--max-new N] [--epochs N]

Data: the target's own greedy answers to chat-templated prompts written here (not the benchmark's prompts), with
labels = the target's argmax at every position (prompt positions included: free extra data). The aux states come
from transformers (`output_hidden_states`). Training is EAGLE-3's test-time training over STEPS chained draft
steps, with the forward in eagle3_ref.py (vLLM's conventions), so what is trained is what vLLM serves.
Writes config.json + model.safetensors in the format vLLM loads, and specdiag.json with the validation accuracy.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).parent))
from eagle3_ref import Eagle3  # noqa: E402
from target_states import encode, greedy, load_target  # noqa: E402
from train_prompts import ASK, MORE_SUBJECTS, SUBJECTS, TEMPLATES  # noqa: E402

STEPS = 3  # chained draft steps trained (test-time training); vLLM serves k of them
LAYERS = [2, 15, 27]  # vLLM's default aux layer ids for a 30-layer target: (2, N//2, N-3)


def log(msg: str) -> None:
    print(f"[train-eagle3] {msg}", flush=True)


CHAT = Path(__file__).parents[1] / "prompts" / "chat.jsonl"  # the demo's default prompt set: never trained on


ALL_SUBJECTS = list(dict.fromkeys(SUBJECTS + MORE_SUBJECTS))


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # a GPU when there is one (a lent one)


@torch.inference_mode()
def self_instruct(model, tok, n: int, batch: int = 256) -> list[str]:
    """N prompts the target writes itself (sampled), on the SUBJECTS, asked in ASK's ways: the variety of a chat
    dataset, in the target's own words, with none of the benchmark's prompts."""
    rng = random.Random(1)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out, seen, tries = [], set(), 0
    while len(out) < n and tries < 4 * n // batch + 8:  # bounded: a target that repeats itself ends it early
        tries += 1
        chunk = [encode(tok, rng.choice(ASK).format(rng.choice(ALL_SUBJECTS)), chat=True) for _ in range(batch)]
        width = max(len(c) for c in chunk)
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in chunk], device=DEVICE)
        mask = (torch.arange(width, device=DEVICE)[None] >= torch.tensor([width - len(c) for c in chunk],
                                                                           device=DEVICE)[:, None]).long()
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=48, do_sample=True,
                             temperature=0.9, top_p=0.95, pad_token_id=pad)
        for row in tok.batch_decode(gen[:, width:], skip_special_tokens=True):
            text = row.strip().split("\n")[0].strip()
            quoted = re.search(r'"([^"]{15,200})', text)  # 'A curious person might ask, "How do ...?"'
            text = re.sub(r"^(question|request|task)\s*:\s*", "", quoted[1] if quoted else text, flags=re.I).strip()
            if 15 <= len(text) <= 200 and text.lower() not in seen:
                seen.add(text.lower())
                out.append(text)
    return out[:n]


def build_data(target: str, n_prompts: int, max_new: int, n_self: int = 0, dtype=torch.float32):
    model, tok = load_target(target, dtype=dtype)
    model.to(DEVICE)
    prompts = [t.format(s) for s, t in itertools.product(ALL_SUBJECTS, TEMPLATES)]
    random.Random(0).shuffle(prompts)
    prompts = prompts[:n_prompts]
    if n_self:
        start = time.monotonic()
        prompts += self_instruct(model, tok, n_self)
        log(f"{n_self} prompts written by the target in {time.monotonic() - start:.0f} s, e.g. {prompts[-3:]}")
        random.Random(2).shuffle(prompts)
    held_out = {json.loads(line)["prompt"].strip().lower() for line in CHAT.read_text().splitlines() if line.strip()}
    prompts = [p for p in prompts if p.strip().lower() not in held_out]  # the benchmark's chat prompts stay out
    encoded = [encode(tok, p, chat=True) for p in prompts]
    start = time.monotonic()
    pairs = greedy(model, tok, encoded, max_new, batch=512 if DEVICE.type == "cuda" else 64)
    log(f"greedy answers: {sum(len(g) for _, g in pairs)} tokens in {time.monotonic() - start:.0f} s")
    data = []
    step = 64 if DEVICE.type == "cuda" else 1  # right-padded batches: causal attention leaves real positions exact
    for i in range(0, len(pairs), step):
        seqs = [p + g for p, g in pairs[i:i + step]]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=DEVICE)
        with torch.inference_mode():
            out = model(input_ids=ids, output_hidden_states=True)
        for row, s in enumerate(seqs):
            aux = torch.cat([out.hidden_states[k][row, :len(s)] for k in LAYERS], -1)
            labels = out.logits[row, :len(s)].argmax(-1)  # the target's next token at every position
            data.append((ids[row, :len(s)].clone(), aux.to(torch.bfloat16), labels))
    embed = model.get_input_embeddings().weight.detach().clone().float()
    return model, data, embed


def packed(data, limit: int):
    """Sequences joined up to LIMIT positions, so one step trains on several (a GPU idles on one short sequence);
    a drafter step then also sees the end of the sequence before, as a long chat does."""
    out, cur = [], []
    for seq in data:
        if cur and sum(len(i) for i, _, _ in cur) + len(seq[0]) > limit:
            out.append(tuple(torch.cat(parts) for parts in zip(*cur)))
            cur = []
        cur.append(seq)
    if cur:
        out.append(tuple(torch.cat(parts) for parts in zip(*cur)))
    return out


def draft_vocab(data, size: int, vocab: int) -> torch.Tensor:
    counts = torch.zeros(vocab, dtype=torch.long)
    for _, _, labels in data:
        counts += torch.bincount(labels.cpu(), minlength=vocab)
    return torch.sort(torch.topk(counts, size).indices).values


def init_drafter(model, embed, ids_kept: torch.Tensor, intermediate: int = 0) -> Eagle3:
    """intermediate: the head's MLP width (0: the target's); a wider MLP starts as the target's last layer's, its
    extra units adding nothing until trained."""
    tcfg = model.config.to_dict()
    cfg = {k: tcfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                 "rms_norm_eps", "max_position_embeddings", "vocab_size", "head_dim",
                                 "bos_token_id", "eos_token_id") if k in tcfg}
    cfg.update({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                "draft_vocab_size": len(ids_kept), "target_hidden_size": tcfg["hidden_size"],
                "eagle_aux_hidden_state_layer_ids": LAYERS, "tie_word_embeddings": False,
                "rope_parameters": tcfg.get("rope_parameters") or {"rope_theta": tcfg.get("rope_theta", 10000.0),
                                                                   "rope_type": "default"}})
    cfg["intermediate_size"] = intermediate or cfg["intermediate_size"]
    d = Eagle3(cfg, embed.float()).to(DEVICE)
    ids_kept = ids_kept.to(DEVICE)
    h = cfg["hidden_size"]
    last = model.model.layers[-1]
    with torch.no_grad():  # start from the target's last layer reading the deepest aux state
        d.fc.weight.zero_()
        d.fc.weight[:, 2 * h:] = torch.eye(h, device=DEVICE)
        for name in ("q_proj", "k_proj", "v_proj"):
            w = getattr(last.self_attn, name).weight
            getattr(d.midlayer.self_attn, name).weight.copy_(torch.cat([0.1 * w, w], 1))
        d.midlayer.self_attn.o_proj.weight.copy_(last.self_attn.o_proj.weight)
        m = last.mlp.down_proj.weight.shape[1]
        for name in ("gate_proj", "up_proj"):
            getattr(d.midlayer.mlp, name).weight[:m].copy_(getattr(last.mlp, name).weight)
        d.midlayer.mlp.down_proj.weight.zero_()
        d.midlayer.mlp.down_proj.weight[:, :m].copy_(last.mlp.down_proj.weight)
        d.midlayer.input_layernorm.weight.copy_(last.input_layernorm.weight)
        d.midlayer.hidden_norm.weight.copy_(last.input_layernorm.weight)
        d.midlayer.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        d.norm.weight.copy_(model.model.norm.weight)
        d.lm_head.weight.copy_(embed[ids_kept])
        d.d2t.copy_(ids_kept - torch.arange(len(ids_kept), device=DEVICE))
        d.t2d.zero_()
        d.t2d[ids_kept] = True
    return d


def step_losses(d: Eagle3, ids, aux, labels, t2d_index):
    """Per step: (loss, correct, count). Step j at slot t predicts the target's token after ids[t+j+1]."""
    out = []
    for j, logits in enumerate(d.chain_logits(aux.float(), ids, STEPS)):
        want = t2d_index[labels[1 + j: 1 + j + logits.shape[0]]]  # -1 where the token is outside the draft vocab
        ok = want >= 0
        loss = F.cross_entropy(logits[ok], want[ok]) if ok.any() else logits.sum() * 0
        out.append((loss, (logits.argmax(-1) == want).sum().item(), len(want)))
    return out


def train(d: Eagle3, data, epochs: int, vocab: int, deadline: float = float("inf"), pack: int = 0,
          header: list[int] | None = None, window: int = 32):
    """deadline: time.monotonic() after which no new epoch starts (a machine lent for a few minutes); after each
    epoch the plan shrinks to the epochs that can still start before it, so the learning rate decays to its end.
    pack: join training sequences up to this many positions per step (0: one sequence per step).
    header: the chat template's generation prompt (token ids): where given, each epoch also measures the accuracy
    on the first WINDOW answer tokens of the held-out sequences, what a chat benchmark serves, and the weights of
    the epoch best there at step 0 are kept. Every-position accuracy also counts the prompt (the same system prompt
    in every sequence) and long answers' repetitive tails; the chat benchmark serves the start of each answer."""
    t2d_index = torch.full((vocab,), -1, dtype=torch.long, device=DEVICE)
    kept = torch.nonzero(d.t2d).squeeze(1)
    t2d_index[kept] = torch.arange(len(kept), device=DEVICE)
    n_val = min(1000, max(4, len(data) // 10))  # enough to choose an epoch; more only slows each epoch down
    val, tr = data[:n_val], data[n_val:]
    tr = packed(tr, pack) if pack else tr
    params = [p for p in d.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    planned = epochs  # the learning rate reaches its floor at the end of the last planned epoch (read at each step)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / 50) * max(0.05, 1 - i / (planned * len(tr))))
    rng = random.Random(0)
    acc, best = [], None
    starts = answer_starts(val, header) if header else None
    epoch = 0
    while epoch < planned:
        start = time.monotonic()
        rng.shuffle(tr)
        d.train()
        for ids, aux, labels in tr:
            losses = step_losses(d, ids, aux, labels, t2d_index)
            loss = sum(l * 0.8 ** j for j, (l, _, _) in enumerate(losses))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
        acc = evaluate(d, val, t2d_index)
        line = f"epoch {epoch + 1}/{planned}: {time.monotonic() - start:.0f} s, val accuracy per step " + \
            " ".join(f"{a:.3f}" for a in acc)
        if starts:
            first = evaluate(d, val, t2d_index, starts, window)
            line += f"; first {window} answer tokens " + " ".join(f"{a:.3f}" for a in first)
            if not best or first[0] > best[1][0]:
                best = ({k: v.detach().clone() for k, v in d.state_dict().items()}, first, acc, epoch + 1)
        log(line)
        took = time.monotonic() - start
        epoch += 1
        fit = epoch + max(0, math.ceil((deadline - time.monotonic()) / took))
        if fit < planned:
            log(f"deadline: {fit} of {planned} epochs fit")
            planned = fit
    if best:
        d.load_state_dict(best[0])
        log(f"kept epoch {best[3]}: first {window} answer tokens " + " ".join(f"{a:.3f}" for a in best[1]))
        return best[2], best[1], planned
    return acc, [], planned


@torch.no_grad()
def evaluate(d: Eagle3, data, t2d_index, starts: list[int] | None = None, window: int = 0) -> list[float]:
    """Accuracy per draft step at every position, or (starts) only at the slots of each sequence's first WINDOW
    answer tokens: slot t drafts ids[t+2+j] from the target's states up to t (offline_eval.py's slots)."""
    d.eval()
    right, seen = [0] * STEPS, [0] * STEPS
    for i, (ids, aux, labels) in enumerate(data):
        for j, logits in enumerate(d.chain_logits(aux.float(), ids, STEPS)):
            lo, hi = (0, logits.shape[0]) if starts is None else (starts[i] - 1, starts[i] - 1 + window)
            hi = min(hi, logits.shape[0], len(labels) - 1 - j)
            if starts is not None and starts[i] == 0 or hi <= lo:
                continue
            want = t2d_index[labels[1 + j + lo: 1 + j + hi]]
            right[j] += (logits[lo:hi].argmax(-1) == want).sum().item()
            seen[j] += hi - lo
    return [r / max(1, s) for r, s in zip(right, seen)]


def generation_header(tok) -> list[int]:
    """The chat template's generation prompt as token ids (SmolLM2: '<|im_start|>assistant\\n')."""
    turn = [{"role": "user", "content": "x"}]
    plain = tok.apply_chat_template(turn, add_generation_prompt=False, tokenize=True)
    plain = list(plain["input_ids"] if hasattr(plain, "keys") else plain)
    return encode(tok, "x", chat=True)[len(plain):]


def answer_starts(data, header: list[int]) -> list[int]:
    """Per sequence, the position of its first answer token: just after the last generation prompt (0: none)."""
    n, out = len(header), []
    for ids, _, _ in data:
        row = ids.tolist()
        out.append(next((i + n for i in range(len(row) - n, -1, -1) if row[i:i + n] == header), 0))
    return out


def save(d: Eagle3, out: Path, stats: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).cpu().contiguous()
          for k, v in d.state_dict().items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(d.cfg, indent=2))
    (out / "specdiag.json").write_text(json.dumps(stats, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("out", type=Path)
    ap.add_argument("--prompts", type=int, default=224)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--deadline-s", type=float, default=float("inf"), help="start no epoch after this many seconds")
    ap.add_argument("--keep-data", action="store_true", help="keep OUT/data.pt to retrain without regenerating")
    ap.add_argument("--extra-data", type=Path, action="append", default=[],
                    help="a data.pt kept from an earlier run (--keep-data) to train on as well")
    ap.add_argument("--self-instruct", type=int, default=0, help="add N prompts the target writes itself")
    ap.add_argument("--data-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the target's dtype for the data (bfloat16: as the demo server runs it)")
    ap.add_argument("--intermediate", type=int, default=0, help="the head's MLP width (default: the target's)")
    ap.add_argument("--answer-window", type=int, default=32,
                    help="also validate on the first N answer tokens and keep the epoch best there (0: off)")
    ap.add_argument("--pack", type=int, default=0, help="join sequences up to N positions per training step")
    args = ap.parse_args()
    torch.manual_seed(0)
    start = time.monotonic()
    cache = args.out / "data.pt"
    if cache.exists():
        model, _ = load_target(args.target)
        model.to(DEVICE)
        data, embed = torch.load(cache, map_location=DEVICE, weights_only=True)
    else:
        model, data, embed = build_data(args.target, args.prompts, args.max_new, args.self_instruct,
                                        getattr(torch, args.data_dtype))
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save((data, embed), cache)
    for extra in args.extra_data:
        data = data + torch.load(extra, map_location=DEVICE, weights_only=True)[0]
    log(f"data: {len(data)} sequences, {sum(len(i) for i, _, _ in data)} positions")
    kept = draft_vocab(data, args.draft_vocab, embed.shape[0])
    d = init_drafter(model, embed, kept, args.intermediate)
    header = generation_header(AutoTokenizer.from_pretrained(args.target)) if args.answer_window else None
    acc, first, ran = train(d, data, args.epochs, embed.shape[0], start + args.deadline_s, args.pack, header,
                       args.answer_window)
    save(d, args.out, {"val_accuracy_per_step": acc, f"val_first_{args.answer_window}_answer_tokens": first,
                       "sequences": len(data), "epochs": ran,
                       "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu",
                       "positions": sum(len(i) for i, _, _ in data), "argv": sys.argv[1:],
                       "build_s": round(time.monotonic() - start)})
    if not args.keep_data:
        cache.unlink()
    log(f"wrote {args.out} in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
