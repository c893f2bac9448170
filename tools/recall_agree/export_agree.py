"""Export a train_agree.py checkpoint as data/recall-agree (config.json + model.safetensors) and
write its golden reference outputs (golden/{passkey,chain,filler}.json).

  /usr/bin/python3 tools/recall_agree/export_agree.py /tmp/recall-agree/run/model_final.pt data/recall-agree

config.json: recall-8kv's (HF LlamaConfig names, bos_token_id 2). model.safetensors: float32,
HF Llama tensor names (st_io.py). Golden files as shared/models/training/golden.py writes them,
for the same three prompts as data/recall-8kv/golden (so the models can be compared on one
input): prompt ids, float32 last-position logits after the prompt (7 significant digits), the
full-cache greedy continuation of 24 bytes and the max logit of each greedy step. Computed here
by full float32 forward passes of model.py (no cache), which is the same function.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import st_io  # noqa: E402
from model import Config, LlamaForCausalLM  # noqa: E402

CONT = 24


def sig7(x):
    return float("%.7g" % x)


def export(ckpt, outdir):
    st = torch.load(ckpt, map_location="cpu")
    sd = {k: v.float().contiguous() for k, v in st["model"].items()}
    os.makedirs(outdir, exist_ok=True)
    meta = {"format": "pt", "tokenizer": "bytes", "model": "recall-agree",
            "training_step": str(st.get("step", "")), "source": "tools/recall_agree/train_agree.py"}
    path = os.path.join(outdir, "model.safetensors")
    st_io.save_file(sd, path, meta)
    with open(os.path.join(ROOT, "data", "recall-8kv", "config.json")) as f:
        cfg = json.load(f)
    for k, v in st["config"].items():
        assert cfg[k] == v, (k, cfg[k], v)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    back, _ = st_io.load_file(path)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
    print("wrote", path, os.path.getsize(path), "bytes,", sum(v.numel() for v in sd.values()), "parameters")
    m = LlamaForCausalLM(Config(**st["config"]))
    m.load_state_dict(back)
    m.eval()
    return m


@torch.no_grad()
def golden(m, outdir):
    gdir = os.path.join(outdir, "golden")
    os.makedirs(gdir, exist_ok=True)
    for task in ("passkey", "chain", "filler"):
        with open(os.path.join(ROOT, "data", "recall-8kv", "golden", task + ".json")) as f:
            ref = json.load(f)
        prompt, answer = ref["prompt"], ref["expected_answer"]
        ids = list(prompt.encode("utf-8"))
        assert ids == ref["prompt_ids"]
        gen, step_max, last = [], [], None
        for i in range(CONT):
            logits = m(torch.tensor([ids + gen]))[0, -1]
            if i == 0:
                last = logits
            step_max.append(sig7(logits.max()))
            gen.append(int(logits.argmax()))
        text = bytes(gen).decode("utf-8", "replace")
        rec = {
            "task": task,
            "prompt": prompt,
            "prompt_ids": ids,
            "n_prompt": len(ids),
            "expected_answer": answer,
            "greedy_ids": gen,
            "greedy_text": text,
            "greedy_matches_answer": None if answer is None else text.startswith(answer),
            "last_logits": [sig7(v) for v in last.tolist()],
            "last_logits_argmax": int(last.argmax()),
            "greedy_step_max_logit": step_max,
            "dtype": "float32",
            "note": "logits after prefilling prompt_ids (positions 0..n_prompt-1); greedy continuation with the full KV cache",
        }
        with open(os.path.join(gdir, task + ".json"), "w") as f:
            json.dump(rec, f)
            f.write("\n")
        print(task, len(ids), repr(text), "expected", repr(answer))


if __name__ == "__main__":
    torch.set_num_threads(2)
    golden(export(sys.argv[1], sys.argv[2]), sys.argv[2])
