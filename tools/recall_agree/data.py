"""(Copied from shared/models/training/data.py; BOS 0x02 and the corpus path are the only changes.)

Task generators: passkey retrieval, multi-hop chain following (drift), filler LM.

Every example is a byte string of exactly `length` bytes = prompt + answer.
Filler comes from the corpus built by build_corpus.py: ASCII English, no digits, no '->'.
"""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
_CORPUS = None

PASSKEY_NEEDLE = "The pass key is {key}. Remember it. "
PASSKEY_QUESTION = " What is the pass key? The pass key is"
CHAIN_QUESTION = " Follow {start}:"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
NAMES = [a + d for a in LETTERS for d in "0123456789"]


CORPUS_PATH = os.environ.get("TINY_RECALL_CORPUS", "/tmp/recall-agree/corpus.txt")
# A fixed first byte (STX) before every example, so that the model can grow an attention sink
# as real LLMs do on their BOS token. Empty for tiny-recall (v1), "\x02" for recall-8kv.
BOS = os.environ.get("TINY_RECALL_BOS", "\x02")


def corpus():
    """The filler corpus, built by build_corpus.py on first use (about 10 s)."""
    global _CORPUS
    if _CORPUS is None:
        if not os.path.exists(CORPUS_PATH):
            import build_corpus
            build_corpus.main(CORPUS_PATH)
        with open(CORPUS_PATH) as f:
            _CORPUS = f.read()
    return _CORPUS


def filler(rng, n):
    """n bytes of corpus text starting at a word boundary."""
    text = corpus()
    while True:
        s = rng.randrange(0, len(text) - n - 200)
        s = text.find(" ", s) + 1
        if s > 0 and s + n <= len(text):
            return text[s:s + n]


def insert_at_depths(rng, base, inserts, depths):
    """Insert strings into base at word boundaries nearest to the given depths.

    Returns (text, start offsets of each insert in the final text) in the input order."""
    spots = []
    total = len(base) + sum(len(s) for s in inserts)
    for d in depths:
        # aim for insert start / final length ~= d
        p = min(len(base), int(d * total))
        # snap to the start of a word (after a space), searching forward then backward
        q = base.find(" ", p)
        if q == -1:
            q = base.rfind(" ", 0, p)
        p = q + 1 if q != -1 else 0
        spots.append(p)
    order = sorted(range(len(inserts)), key=lambda i: (spots[i], i))
    out, starts, prev, shift = [], [0] * len(inserts), 0, 0
    for i in order:
        p = spots[i]
        out.append(base[prev:p])
        starts[i] = p + shift
        out.append(inserts[i])
        shift += len(inserts[i])
        prev = p
    out.append(base[prev:])
    return "".join(out), starts


def make_passkey(rng, length, depth=None):
    key = str(rng.randrange(10000, 100000))
    needle = PASSKEY_NEEDLE.format(key=key)
    answer = " " + key + "."
    n = length - len(PASSKEY_QUESTION) - len(answer) - len(needle) - len(BOS)
    base = filler(rng, n)
    if depth is None:
        depth = rng.random()
    ctx, starts = insert_at_depths(rng, base, [needle], [depth])
    prompt = BOS + ctx + PASSKEY_QUESTION
    assert len(prompt) + len(answer) == length, (len(prompt), len(answer), length)
    return dict(task="passkey", prompt=prompt, answer=answer, context_len=length,
                depth=round(starts[0] / max(1, len(ctx)), 4), needle_start=starts[0])


def make_chain(rng, length, hops=3, distractors=None, depths=None):
    if distractors is None:
        distractors = rng.randint(1, max(1, min(4, length // 128)))
    n_chains = 1 + distractors
    names = rng.sample(NAMES, n_chains * (hops + 1))
    chains = [names[i * (hops + 1):(i + 1) * (hops + 1)] for i in range(n_chains)]
    edges = []  # (chain index, hop index, text)
    for ci, ch in enumerate(chains):
        for h in range(hops):
            edges.append((ci, h, "%s -> %s. " % (ch[h], ch[h + 1])))
    target = chains[0]
    answer = " " + " ".join(target[1:]) + "."
    question = CHAIN_QUESTION.format(start=target[0])
    n = length - len(question) - len(answer) - sum(len(e[2]) for e in edges) - len(BOS)
    base = filler(rng, n)
    if depths is None:
        depths = [rng.random() for _ in edges]
    else:  # depths given for the target chain's hops; distractors random
        depths = list(depths) + [rng.random() for _ in edges[hops:]]
    ctx, starts = insert_at_depths(rng, base, [e[2] for e in edges], depths)
    prompt = BOS + ctx + question
    assert len(prompt) + len(answer) == length
    hop_depths = [round(starts[i] / len(ctx), 4) for i in range(hops)]
    return dict(task="chain", prompt=prompt, answer=answer, context_len=length,
                depth=hop_depths[0], hop_depths=hop_depths, hop_starts=starts[:hops],
                n_chains=n_chains)


def make_filler(rng, length):
    return dict(task="filler", prompt=BOS + filler(rng, length - len(BOS)), answer="",
                context_len=length, depth=None)


def make_example(rng, length, mix=(0.4, 0.45, 0.15)):
    r = rng.random()
    if r < mix[0]:
        return make_passkey(rng, length)
    if r < mix[0] + mix[1]:
        return make_chain(rng, length)
    return make_filler(rng, length)


if __name__ == "__main__":
    rng = random.Random(0)
    for L in (256, 512):
        for f in (make_passkey, make_chain):
            e = f(rng, L)
            print(repr(e["prompt"][-300:]), "=>", repr(e["answer"]), e["depth"])
            print()
