#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Writes data/eval/calibration.jsonl: tiny-recall's calibration prompts (12 passkey + 12 chain),
# built the way recall-8kv's calibration set (data/eval/recall-8kv/calibration.jsonl) was: the
# task formats of data/tiny-recall/README.md ("Tasks and prompt formats"), context lengths
# cycling 512 / 1024 / 2048, needle depths 0.1, 0.2, 0.3, 0.4 (three prompts each, placed at the
# first word boundary at or after the depth), protocol v2 (the separator space ends the prompt;
# shared/eval/v2/README.md), no BOS byte (tiny-recall has none).
#
# Filler: lower-case ASCII prose from Debian's licence texts and package copyright files on the
# machine that runs this (/usr/share/common-licenses/*, /usr/share/doc/*/copyright, read in
# sorted order), digits and "->" removed, whitespace collapsed — the kind of text the models were
# trained and evaluated on (data/tiny-recall/README.md).
#
# Disjoint from every evaluation prompt: a key, a target chain (start name and answer) or a
# 64-byte window of text that occurs in an evaluation prompt is never used (the evaluation files
# read are data/eval/{passkey,chain}.jsonl, data/eval/recall-8kv/{passkey,chain}.jsonl and, where
# the shared folder is beside the repository, every file of shared/eval/ and shared/eval/v2/
# except calibration sets); the test [eval_v2] in tests/test_eval_v2.cpp checks the result.
#
# Seed 2701 (passkey) and 2702 (chain), Python's random.Random. Run from anywhere:
#   python3 data/eval/make_calibration.py            # writes data/eval/calibration.jsonl
# The shipped file was written by this script on the kvsift build machine; the corpus digest it
# prints is recorded in data/eval/ORIGIN.md (another machine's corpus gives other filler).
import glob
import hashlib
import json
import os
import random
import re
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
shared = os.path.join(os.path.dirname(root), "shared")
WINDOW = 64  # bytes: no calibration prompt shares a window this long with an evaluation prompt
SEED_PASSKEY, SEED_CHAIN = 2701, 2702
CONTEXTS = (512, 1024, 2048)
PER_TASK = 12


def corpus():
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(
        glob.glob("/usr/share/doc/*/copyright"))
    parts, digest, used = [], hashlib.sha256(), 0
    for f in files:
        if not os.path.isfile(f) or os.path.getsize(f) > 64 * 1024:
            continue  # large copyright files are mostly lists of paths, not prose
        with open(f, "rb") as fh:
            raw = fh.read()
        digest.update(raw)
        used += 1
        t = raw.decode("ascii", "ignore").lower().replace("->", " ")
        t = re.sub(r"[0-9]", "", t)
        t = re.sub(r"\s+", " ", t)
        parts.append(t)
    text = " ".join(parts)
    if len(text) < 100000:
        sys.exit("make_calibration.py: too little filler text found under /usr/share")
    return text, digest.hexdigest(), used


def evaluation_prompts():
    paths = [os.path.join(root, "data", "eval", f) for f in ("passkey.jsonl", "chain.jsonl")]
    paths += [os.path.join(root, "data", "eval", "recall-8kv", f)
              for f in ("passkey.jsonl", "chain.jsonl")]
    if os.path.isdir(shared):
        for f in sorted(glob.glob(os.path.join(shared, "eval", "**", "*.jsonl"), recursive=True)):
            if not os.path.basename(f).startswith("calibration"):
                paths.append(f)
    items = []
    for p in paths:
        with open(p) as fh:
            items += [json.loads(l) for l in fh if l.strip()]
    return items, paths


def windows(s):
    return {s[i:i + WINDOW] for i in range(0, max(0, len(s) - WINDOW + 1))}


def filler(rng, text, length, banned):
    """A window of `length` bytes of corpus text starting at a word, sharing no WINDOW-byte
    substring with an evaluation prompt."""
    while True:
        start = rng.randrange(0, len(text) - length - 1)
        while start < len(text) and text[start] != " ":
            start += 1
        s = text[start + 1:start + 1 + length]
        if len(s) == length and not (windows(s) & banned):
            return s


def insert_at(s, depth, piece):
    """`piece` inserted at the first word boundary at or after depth * len(s); returns the text
    and the insertion index."""
    i = int(depth * len(s))
    while i < len(s) and i > 0 and s[i - 1] != " ":
        i += 1
    return s[:i] + piece + s[i:], i


def passkeys(text, banned, used_keys):
    rng = random.Random(SEED_PASSKEY)
    tail = " What is the pass key? The pass key is "
    out = []
    for i in range(PER_TASK):
        ctx = CONTEXTS[i % 3]
        depth = 0.1 * (1 + i // 3)
        while True:
            key = rng.randrange(10000, 100000)
            if str(key) not in used_keys:
                break
        answer = "%d." % key
        needle = "The pass key is %d. Remember it. " % key
        region = ctx - len(answer) - len(tail)  # filler + needle
        body, at = insert_at(filler(rng, text, region - len(needle), banned), depth, needle)
        prompt = body + tail
        assert len(prompt) + len(answer) == ctx
        out.append({"id": "calibration-passkey-%d-%03d" % (SEED_PASSKEY, i), "task": "passkey",
                    "prompt": prompt, "answer": answer, "context_len": ctx,
                    "depth": round(at / len(body), 4)})
    return out


def chains(text, banned, used_targets):
    rng = random.Random(SEED_CHAIN)
    out = []
    for i in range(PER_TASK):
        ctx = CONTEXTS[i % 3]
        depth = 0.1 * (1 + i // 3)
        while True:
            names = rng.sample([chr(65 + a) + str(d) for a in range(26) for d in range(10)], 16)
            groups = [names[4 * c:4 * c + 4] for c in range(4)]  # the target chain first
            target = (groups[0][0], " ".join(groups[0][1:]) + ".")
            if target not in used_targets:
                break
        sentences = [(g[h], "%s -> %s. " % (g[h], g[h + 1]), c, h)
                     for c, g in enumerate(groups) for h in range(3)]
        tail = " Follow %s: " % target[0]
        answer = target[1]
        region = ctx - len(answer) - len(tail)
        body = filler(rng, text, region - sum(len(s[1]) for s in sentences), banned)
        # the target's first hop at `depth`, the other eleven sentences at random depths; the
        # insertion points are chosen on the filler and applied from the back
        depths = [depth] + [rng.random() for _ in range(11)]
        order = [sentences[0]] + rng.sample(sentences[1:], 11)
        points = []
        for d, s in zip(depths, order):
            at = int(d * len(body))
            while 0 < at < len(body) and body[at - 1] != " ":
                at += 1
            if at >= len(body):  # past the last word start: the last word boundary instead
                at = body.rfind(" ") + 1
            points.append((at, s))
        points.sort(key=lambda p: p[0])
        pieces, last = [], 0
        hop_at = {}
        pos = 0
        for at, s in points:
            pieces.append(body[last:at])
            pos += at - last
            if s[2] == 0:
                hop_at[s[3]] = pos
            pieces.append(s[1])
            pos += len(s[1])
            last = at
        pieces.append(body[last:])
        full = "".join(pieces)
        prompt = full + tail
        assert len(prompt) + len(answer) == ctx
        hop_depths = [round(hop_at[h] / len(full), 4) for h in range(3)]
        out.append({"id": "calibration-chain-%d-%03d" % (SEED_CHAIN, i), "task": "chain",
                    "prompt": prompt, "answer": answer, "context_len": ctx,
                    "depth": hop_depths[0], "hop_depths": hop_depths})
    return out


def main():
    text, digest, nfiles = corpus()
    items, paths = evaluation_prompts()
    banned = set()
    for it in items:
        banned |= windows(it["prompt"])
    used_keys = {it["answer"].strip().rstrip(".") for it in items if it["task"] == "passkey"}
    used_targets = set()
    for it in items:
        if it["task"] == "chain":
            m = re.search(r"Follow ([A-Z][0-9]):\s*$", it["prompt"])
            if m:
                used_targets.add((m.group(1), it["answer"].strip()))
    out = passkeys(text, banned, used_keys) + chains(text, banned, used_targets)
    dst = os.path.join(here, "calibration.jsonl")
    with open(dst, "w") as fh:
        for it in out:
            fh.write(json.dumps(it) + "\n")
    print("wrote %s: %d prompts; corpus %d files, sha256 %s; checked against %d evaluation "
          "prompts in %d files" % (dst, len(out), nfiles, digest, len(items), len(paths)))


if __name__ == "__main__":
    main()
