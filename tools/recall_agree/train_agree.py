"""Train recall-agree: recall-8kv fine-tuned so that the heads of a layer attend to the same keys.

The shipped data/recall-agree was made by one run of this script on the shared 2-core CPU
(Debian's python3-torch 1.13; 865 s wall for the 160 steps on one thread while another run and
other builds ran; see data/recall-agree/ORIGIN.md and train.log there):

  nice -n 19 /usr/bin/python3 tools/recall_agree/train_agree.py --out /tmp/recall-agree/run \
      --steps 360 --stop_at 160 --align_layers 0,1,3 --threads 1 --eval_every 20
  /usr/bin/python3 tools/recall_agree/export_agree.py /tmp/recall-agree/run/model_final.pt data/recall-agree

It warm-starts from data/recall-8kv (same architecture: 4 layers, 8 query heads, 8 KV heads,
head_dim 32, BOS byte 0x02). The schedule is set for 360 steps and the run stops at 160, once
the heads' overlap had passed its target; --stop_at keeps the LR schedule of --steps, so the
weights at step 160 are those of the shipped model (a second run of the command, 566 s wall,
gave the same log and bit-identical weights). The schedule depends on the step count
only, never on wall time, so a run is reproducible from --seed, --steps and --stop_at (same
torch build and thread count; the filler corpus is built from /usr/share/doc by build_corpus.py
and so depends on the installed Debian packages: its size is logged, 33,695,646 bytes for the
shipped run).

--align_layers 0,1,3 leaves layer 2 out of the agreement loss: layer 2 holds most of the heads
that copy the passkey's digits (ORIGIN.md), and pulling them together broke the answers of the
first model (the same command without --align_layers and with --stop_at 240, on two threads:
full-KV passkey 8%). With the options added since (--align_layers, --align_ramp, --distill,
--distill_answer) at their defaults, the script trains as it did for that first model.
--init also takes a checkpoint (.pt) of an earlier run, and --align_skip_recent leaves the most
recent keys out of the agreement loss; --distill / --distill_answer add KL(recall-8kv || model)
per byte (mean over all bytes / over the answer bytes): these were tried in runs that ORIGIN.md
lists and none of them is in the shipped model. --align_ramp (the agreement weight ramped up
linearly from 0) was not tried.

Two things push the heads of a layer together:

  * head dropout: in every layer of every training sequence, each attention head's output is
    dropped with probability --head_drop (at least one head kept), the kept ones rescaled by
    H / kept, so that any subset of heads has to do the layer's job (redundant heads);
  * an agreement loss on the attention scores, in the layers --align_layers names (default
    all): for --align_queries query positions per
    sequence (the queries that predict the answer bytes, i.e. the decode steps, then random
    positions in the last three quarters), each head's pre-softmax scores over the keys the
    query sees, the BOS key excepted, are standardised (zero mean, unit variance over the keys)
    and the loss is their mean squared distance to the heads' mean, i.e. about 1 - the mean
    correlation between a head's score vector and the layer's consensus. The ranking of keys,
    hence the top-k set, is what SyncKV's and HeteroCache's calibration compare between heads.

Nothing is copied or tied between heads: every head keeps its own q/k/v/o weights, and the
agreement is learnt by gradient descent. Loss = mean CE over all bytes + 3 * mean CE over the
answer bytes + --align * agreement loss (+ the distillation terms when asked for). Data:
data.py's tasks (passkey / chain / filler mix 0.3 / 0.65 / 0.05, as recall-8kv), every prompt
with the BOS byte, lengths 2048, 1024 or a multiple of 64 in [128, 1024) with probability 1/3
each, --tokens bytes per step (at least one sequence). AdamW (betas 0.9/0.95, weight decay 0.1 on matrices but the embedding), peak LR --lr
(q_proj / k_proj: --lr x --qk_lr_mult), linear warm-up over 30 steps, cosine to 5% at --steps.
bf16 autocast on the CPU (oneDNN), float32 master weights.

Every --eval_every steps (and at the end) it reports, on data/eval/recall-8kv/calibration.jsonl
(every third line: 4 passkey + 4 chain; never the evaluation prompts): teacher-forced exact
match per task and the mean pairwise top-k overlap (k = floor(n / 5)) of the heads of each layer
at the answer queries, against k / s.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import data  # noqa: E402
import st_io  # noqa: E402
from model import Config, LlamaForCausalLM, apply_rope, rope_cos_sin  # noqa: E402

SEQ_MAX = 2048


def load_safetensors_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        hc = json.load(f)
    cfg = Config(**{k: hc[k] for k in Config.__dataclass_fields__})
    m = LlamaForCausalLM(cfg)
    m.load_state_dict(st_io.load_file(os.path.join(model_dir, "model.safetensors"))[0])
    return m


def causal_attention(q, k, v, chunk=512):
    """Softmax attention, causal, query blocks of `chunk` rows (as model.py; torch 1.13 has no SDPA)."""
    B, H, T, D = q.shape
    scale = 1.0 / math.sqrt(D)
    outs = []
    for s0 in range(0, T, chunk):
        e = min(T, s0 + chunk)
        att = torch.matmul(q[:, :, s0:e], k[:, :, :e].transpose(-1, -2)) * scale
        mask = torch.ones(e - s0, e, dtype=torch.bool).triu(s0 + 1)
        att = att.masked_fill(mask, float("-inf"))
        att = torch.softmax(att, dim=-1)  # in the autocast dtype (bf16): fp32 copies cost 2x
        outs.append(torch.matmul(att, v[:, :, :e]))
    return torch.cat(outs, dim=2)


def forward(model, ids, head_keep=None, align_pos=None, align_valid=None, skip_recent=0, align_layers=None):
    """model.py's forward with optional head dropout and the agreement loss.

    ids [B, T]; head_keep [layers, B, H] scale factors (0 for a dropped head) or None;
    align_pos [B, m] query positions for the agreement loss (None: no loss).
    align_layers: the layers whose heads the loss pulls together (None: all); the loss is still
    divided by the number of layers.
    Returns (logits [B, T, V], agreement loss averaged over layers, a float tensor)."""
    c = model.config
    B, T = ids.shape
    H, D = c.num_attention_heads, c.head_dim
    assert c.num_key_value_heads == H
    cos, sin = rope_cos_sin(torch.arange(T), D, c.rope_theta)
    x = model.model.embed_tokens(ids)
    align = torch.zeros((), dtype=torch.float32)
    for li, layer in enumerate(model.model.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_proj(h).view(B, T, H, D).transpose(1, 2)
        k = a.k_proj(h).view(B, T, H, D).transpose(1, 2)
        v = a.v_proj(h).view(B, T, H, D).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = causal_attention(q, k, v)  # [B, H, T, D]
        if head_keep is not None:
            o = o * head_keep[li].to(o.dtype)[:, :, None, None]
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, T, H * D))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if align_pos is not None and (align_layers is None or li in align_layers):
            m = align_pos.shape[1]
            idx = align_pos[:, None, :, None].expand(B, H, m, D)
            qs = torch.gather(q, 2, idx).float()                       # [B, H, m, D]
            s = torch.matmul(qs, k.float().transpose(-1, -2)) / math.sqrt(D)  # [B, H, m, T]
            keys = torch.arange(T)[None, None, :]
            # the keys the query sees but the BOS sink (key 0): every head puts it first, and its
            # outlier score would swamp the standardisation of the others
            # and, with skip_recent r > 0, the r most recent keys (t - r, t]: heads that read the
            # previous token, or the one before, keep their own local offset
            valid = ((keys <= align_pos[:, :, None] - skip_recent) & (keys >= 1))[:, None]  # [B,1,m,T]
            cnt = valid.sum(-1, keepdim=True).clamp(min=1)
            s = s.masked_fill(~valid, 0.0)
            mu = s.sum(-1, keepdim=True) / cnt
            var = ((s - mu).pow(2) * valid).sum(-1, keepdim=True) / cnt
            z = (s - mu) * torch.rsqrt(var + 1e-4) * valid
            zbar = z.mean(1, keepdim=True)
            per_q = ((z - zbar).pow(2).sum(-1) / cnt.squeeze(-1)).mean(1)  # [B, m]
            w = align_valid.float()
            align = align + (per_q * w).sum() / w.sum().clamp(min=1.0)
    logits = model.lm_head(model.model.norm(x))
    n_layers = len(model.model.layers)
    return logits, align / n_layers


def draw_length(rng):
    r = rng.random()
    if r < 1 / 3:
        return SEQ_MAX
    if r < 2 / 3:
        return SEQ_MAX // 2
    return rng.randrange(128, SEQ_MAX // 2, 64)


def make_batch(rng, L, B, mix, m_align):
    ids, mask, pos, pvalid = [], [], [], []
    for _ in range(B):
        ex = data.make_example(rng, L, mix)
        p = ex["prompt"].encode()
        seq = list(p + ex["answer"].encode())
        assert len(seq) == L
        mk = [0.0] * (L - 1)
        ans_q = list(range(len(p) - 1, L - 1))  # logits at t predict seq[t+1]
        for t in ans_q:
            mk[t] = 1.0
        qs = ans_q[:m_align]
        lo = min(L // 4, L - 2)
        while len(qs) < m_align:
            qs.append(rng.randrange(lo, L - 1))
        ids.append(seq)
        mask.append(mk)
        pos.append(qs)
        pvalid.append([1] * m_align)
    return (torch.tensor(ids, dtype=torch.long), torch.tensor(mask), torch.tensor(pos, dtype=torch.long),
            torch.tensor(pvalid, dtype=torch.bool))


def head_keep_mask(gen, layers, B, H, p_drop):
    keep = torch.rand(layers, B, H, generator=gen) >= p_drop
    none = ~keep.any(-1)
    if none.any():  # keep one head at random where all were dropped
        pick = torch.randint(0, H, (layers, B), generator=gen)
        keep[none] = F.one_hot(pick[none], H).bool()
    keep = keep.float()
    return keep * (H / keep.sum(-1, keepdim=True))


@torch.no_grad()
def monitor(model, rows):
    """Teacher-forced exact match per task and top-k (k = n / 5) overlap between the heads of a
    layer (mean over pairs) at the answer queries, against k / s (random sets)."""
    model.eval()
    c = model.config
    L, H, D = c.num_hidden_layers, c.num_attention_heads, c.head_dim
    res, ov, rnd, n_ov = {}, torch.zeros(L), 0.0, 0
    for r in rows:
        p = r["prompt"].encode()
        seq = list(p + r["answer"].encode())
        ids = torch.tensor([seq[:-1]])
        T = ids.shape[1]
        nq = len(seq) - len(p)
        qpos = torch.arange(len(p) - 1, len(p) - 1 + nq)
        cos, sin = rope_cos_sin(torch.arange(T), D, c.rope_theta)
        x = model.model.embed_tokens(ids)
        for li, layer in enumerate(model.model.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                q, k, _ = a.qkv(h, cos, sin)
            s = torch.matmul(q[0][:, qpos].float(), k[0].float().transpose(-1, -2))  # [H, nq, T]
            for j, t in enumerate(qpos.tolist()):
                seen = t + 1
                kk = max(1, len(p) // 5)
                top = s[:, j, :seen].topk(min(kk, seen), dim=-1).indices
                sets = [set(top[hh].tolist()) for hh in range(H)]
                tot = sum(len(sets[i] & sets[jj]) for i in range(H) for jj in range(H) if i != jj)
                ov[li] += tot / (H * (H - 1) * min(kk, seen))
                if li == 0:
                    rnd += min(kk, seen) / seen
                    n_ov += 1
            with torch.autocast("cpu", dtype=torch.bfloat16):
                x = x + a(h, cos, sin)
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = model.lm_head(model.model.norm(x.float())).float()
        pred = logits[0, len(p) - 1:].argmax(-1)
        tgt = torch.tensor(seq[len(p):])
        e = res.setdefault(r["task"], [0, 0])
        e[0] += int(bool((pred == tgt).all()))
        e[1] += 1
    model.train()
    out = {t: round(v[0] / v[1], 3) for t, v in sorted(res.items())}
    out["overlap_by_layer"] = [round(float(v) / n_ov, 3) for v in ov]
    out["overlap"] = round(float(ov.mean()) / n_ov, 3)
    out["random"] = round(rnd / n_ov, 3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", default=os.path.join(ROOT, "data", "recall-8kv"))
    ap.add_argument("--out", default="/tmp/recall-agree/run")
    ap.add_argument("--steps", type=int, default=360)
    ap.add_argument("--stop_at", type=int, default=0, help="stop (and save) at this step (0: --steps)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--answer_weight", type=float, default=3.0)
    ap.add_argument("--qk_lr_mult", type=float, default=6.0, help="LR multiplier of q_proj / k_proj")
    ap.add_argument("--head_drop", type=float, default=0.2)
    ap.add_argument("--align", type=float, default=4.0)
    ap.add_argument("--align_queries", type=int, default=16)
    ap.add_argument("--align_skip_recent", type=int, default=0,
                    help="leave the query's r most recent keys out of the agreement loss")
    ap.add_argument("--align_layers", default="",
                    help="comma-separated layers the agreement loss applies to (empty: all)")
    ap.add_argument("--align_ramp", type=int, default=0,
                    help="ramp the agreement weight linearly from 0 to --align over this many steps")
    ap.add_argument("--distill", type=float, default=0.0,
                    help="weight of KL(teacher || student) per byte, mean over all bytes")
    ap.add_argument("--distill_answer", type=float, default=0.0,
                    help="weight of KL(teacher || student) per byte, mean over the answer bytes")
    ap.add_argument("--teacher", default=os.path.join(ROOT, "data", "recall-8kv"))
    ap.add_argument("--mix", default="0.3,0.65,0.05", help="passkey,chain,filler probabilities")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval_every", type=int, default=40)
    ap.add_argument("--monitor", default=os.path.join(ROOT, "data", "eval", "recall-8kv", "calibration.jsonl"))
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    rng = random.Random(args.seed)
    mix = tuple(float(x) for x in args.mix.split(","))
    os.makedirs(args.out, exist_ok=True)
    if args.init.endswith(".pt"):  # a checkpoint of an earlier stage of this script
        st = torch.load(args.init, map_location="cpu")
        model = LlamaForCausalLM(Config(**st["config"]))
        model.load_state_dict(st["model"])
    else:
        model = load_safetensors_model(args.init)
    model.train()
    cfg = model.config
    align_layers = [int(x) for x in args.align_layers.split(",")] if args.align_layers else None
    teacher = None
    if args.distill > 0 or args.distill_answer > 0:
        teacher = load_safetensors_model(args.teacher)
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
    qk = [p for n, p in model.named_parameters() if n.endswith(("q_proj.weight", "k_proj.weight"))]
    decay = [p for n, p in model.named_parameters()
             if p.dim() == 2 and "embed" not in n and not n.endswith(("q_proj.weight", "k_proj.weight"))]
    other = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": qk, "weight_decay": 0.1, "mult": args.qk_lr_mult},
                             {"params": decay, "weight_decay": 0.1, "mult": 1.0},
                             {"params": other, "weight_decay": 0.0, "mult": 1.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    log = open(os.path.join(args.out, "train.log"), "a")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    rows = [json.loads(l) for l in open(args.monitor)][::3]  # 4 passkey + 4 chain
    say("torch %s threads %d args %s" % (torch.__version__, torch.get_num_threads(), vars(args)))
    say("corpus %d bytes" % len(data.corpus()))
    t0 = time.time()
    say("EVAL step 0 %s (%.0fs)" % (json.dumps(monitor(model, rows)), time.time() - t0))
    stop = args.stop_at or args.steps
    ema = {}
    t_start = time.time()

    def save(tag, step):
        torch.save({"model": model.state_dict(), "config": cfg.to_dict(), "step": step,
                    "args": vars(args)}, os.path.join(args.out, "model_%s.pt" % tag))

    for step in range(1, stop + 1):
        frac = (step - 1) / args.steps
        lr = args.lr * min(1.0, step / args.warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr * g["mult"]
        L = draw_length(rng)
        B = max(1, args.tokens // L)
        ids, mask, pos, pvalid = make_batch(rng, L, B, mix, args.align_queries)
        keep = (head_keep_mask(gen, cfg.num_hidden_layers, B, cfg.num_attention_heads, args.head_drop)
                if args.head_drop > 0 else None)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, align = forward(model, ids[:, :-1], keep,
                                    pos if args.align > 0 else None, pvalid, args.align_skip_recent,
                                    align_layers)
        ce = F.cross_entropy(logits.float().reshape(-1, 256), ids[:, 1:].reshape(-1),
                             reduction="none").view(B, L - 1)
        lm = ce.mean()
        ans = (ce * mask).sum() / mask.sum().clamp(min=1.0)
        w_align = args.align * (min(1.0, step / args.align_ramp) if args.align_ramp > 0 else 1.0)
        loss = lm + args.answer_weight * ans + w_align * align
        kd = torch.zeros(())
        if teacher is not None:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                tl = teacher(ids[:, :-1])
            tlp = F.log_softmax(tl.float(), -1)
            kl = (tlp.exp() * (tlp - F.log_softmax(logits.float(), -1))).sum(-1)  # [B, L-1]
            kd = args.distill * kl.mean() + args.distill_answer * (kl * mask).sum() / mask.sum().clamp(min=1.0)
            loss = loss + kd
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for kname, v in (("lm", lm.item()), ("ans", ans.item()), ("align", float(align)), ("kd", float(kd))):
            ema[kname] = v if kname not in ema else 0.9 * ema[kname] + 0.1 * v
        if step % 10 == 0:
            say("step %d t=%.0fs L=%d B=%d lr=%.2e lm=%.3f ans=%.3f align=%.3f gn=%.2f" %
                (step, time.time() - t_start, L, B, lr, ema["lm"], ema["ans"], ema["align"], gn)
                + (" kd=%.3f" % ema["kd"] if teacher is not None else ""))
        if step % args.eval_every == 0 or step == stop:
            save("step%05d" % step, step)
            te = time.time()
            say("EVAL step %d t=%.0fs %s (%.0fs)" % (step, time.time() - t_start,
                                                   json.dumps(monitor(model, rows)), time.time() - te))
    save("final", stop)
    say("DONE step %d train seconds %.0f" % (stop, time.time() - t_start))


if __name__ == "__main__":
    main()
