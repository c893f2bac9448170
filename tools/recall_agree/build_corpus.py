"""(Copied unchanged from shared/models/training/build_corpus.py but for the default path.)

Build the filler corpus from English text found under /usr/share (docs, licences).

Sanitised so the retrieval tasks stay unambiguous: ASCII only, no digits,
no '->' arrows, lower case (upper-case letters then only occur in chain names and in
the task templates), whitespace collapsed to single spaces.
Output: one long line of text, by default /tmp/tiny-recall/corpus.txt
(data.py builds it on first use; TINY_RECALL_CORPUS overrides the path).
"""
import gzip, hashlib, os, re, sys

ROOTS = ["/usr/share/common-licenses", "/usr/share/doc"]
OUT = os.environ.get("TINY_RECALL_CORPUS", "/tmp/recall-agree/corpus.txt")


def read(path):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read(400_000)
        else:
            with open(path, "rb") as f:
                data = f.read(400_000)
    except Exception:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def clean(text):
    text = text.encode("ascii", "ignore").decode()
    text = re.sub(r"[0-9]", "", text)
    text = text.replace("->", " ")
    text = re.sub(r"[^A-Za-z .,;:'\"()!?\-\n/]", " ", text)
    out = []
    for line in text.split("\n"):
        s = line.strip()
        if len(s) < 20:
            continue
        letters = sum(c.isalpha() for c in s)
        words = s.split()
        # prose-like: mostly letters, several words of moderate length
        if letters < 0.75 * len(s.replace(" ", "")) or len(words) < 4:
            continue
        if "--" in s or "http" in s or "@" in s or "/" in s:
            continue
        out.append(s)
    t = " ".join(out)
    t = re.sub(r"\s+", " ", t)
    t = re.sub(r"\(\s*\)", "", t)
    t = re.sub(r"\s+([.,;:!?])", r"\1", t)
    return t.strip()


def main(out=OUT):
    seen = set()
    parts = []
    total = 0
    for root in ROOTS:
        for dp, _, fns in sorted(os.walk(root)):
            for fn in sorted(fns):
                p = os.path.join(dp, fn)
                if os.path.islink(p):
                    continue
                if not (fn.startswith(("README", "copyright", "NEWS", "changelog", "FAQ", "TODO", "AUTHORS", "THANKS"))
                        or root.endswith("licenses") or fn.endswith((".txt", ".txt.gz"))):
                    continue
                t = read(p)
                if not t:
                    continue
                t = clean(t)
                if len(t) < 200:
                    continue
                # dedupe by paragraphs of 400 chars
                chunks = [t[i:i + 400] for i in range(0, len(t), 400)]
                keep = []
                for c in chunks:
                    h = hashlib.md5(c.encode()).digest()
                    if h in seen:
                        continue
                    seen.add(h)
                    keep.append(c)
                if keep:
                    s = "".join(keep)
                    parts.append(s)
                    total += len(s)
    text = " ".join(parts)
    text = re.sub(r"\s+", " ", text).lower()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print("corpus bytes", len(text), "files", len(parts))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else OUT)
