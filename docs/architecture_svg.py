#!/usr/bin/env python3
# Writes docs/architecture.svg: how a method is put together, and one decode step's data flow.
# Run from the repository root: python3 docs/architecture_svg.py
from xml.sax.saxutils import escape

W, H = 980, 700
out = []


def box(x, y, w, h, lines, fill="#eef3fb", stroke="#3b5b8c", bold_first=True, size=13):
    out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{fill}" stroke="{stroke}"/>')
    ty = y + 18
    for i, line in enumerate(lines):
        weight = "bold" if (i == 0 and bold_first) else "normal"
        fs = size if i == 0 else size - 2
        out.append(f'<text x="{x + w / 2}" y="{ty}" font-size="{fs}" font-weight="{weight}" '
                   f'text-anchor="middle">{escape(line)}</text>')
        ty += fs + 4


def arrow(x1, y1, x2, y2, label=None, dx=0, dy=-4):
    out.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#333" marker-end="url(#a)"/>')
    if label:
        out.append(f'<text x="{(x1 + x2) / 2 + dx}" y="{(y1 + y2) / 2 + dy}" font-size="11" '
                   f'text-anchor="middle" fill="#444">{escape(label)}</text>')


def title(x, y, text):
    out.append(f'<text x="{x}" y="{y}" font-size="16" font-weight="bold">{escape(text)}</text>')


# --- part 1: the composition -------------------------------------------------------------
title(20, 28, "1. A method: one shell over a store, a recipe of parts and an execution policy")
box(270, 42, 440, 62, ["method<Store, Recipe, Exec>  (method/method.hpp)",
                       "validation, step binding, query history, reset, stats,",
                       "attend(); decode = run_decode(plan_decode(...))"], fill="#fdf3e1", stroke="#9a6b1f")
box(20, 140, 250, 84, ["Store  (store/, thrust/)", "store::dense | store::paged", "store::tiered: host pool + working set",
                       "thrust::dense_store | tiered_store"])
box(710, 140, 250, 84, ["Exec  (core/, thrust/, cuda/)", "exec::host: CPU algorithms (cpu/)",
                        "exec::sim_cpp | sim_omp: Thrust on a CPU", "exec::cuda: Thrust on a GPU"])
box(300, 140, 380, 44, ["Recipe  (method/recipe.hpp)", "recipe<Scorer, Selector, Budgeter, Trigger, Schedule>"])
arrow(400, 104, 170, 140)
arrow(490, 104, 490, 140)
arrow(580, 104, 830, 140)
parts = [("Scorer", "score/"), ("Selector", "select/"), ("Budgeter", "budget/"), ("Trigger", "trigger/")]
for i, (n, d) in enumerate(parts):
    x = 300 + i * 96
    box(x, 210, 88, 40, [n, d], fill="#ffffff", size=12)
    arrow(490, 184, x + 44, 210)
box(300, 266, 380, 40, ["two-tier recipes add: roles/ (SyncKV, HeteroCache),",
                        "domain/ (FreeKV), transfer/ (recall from the host pool)"], fill="#ffffff",
    bold_first=False, size=12)
box(20, 250, 250, 100, ["Schedule state  (method/schedule/)", "evict: a round where the trigger fires",
                        "sparse_read: select what to read (Quest)", "deferred_recall: decide at t, install t+1",
                        "speculative: select ahead, correct (FreeKV)"], fill="#eaf6ec", stroke="#2f7a3d")
box(710, 250, 250, 100, ["device halves  (device/)", "evict, sparse_read: content halves", "of the one body; two-tier: states",
                         "over a device store, exec::sim|cuda:", "no allocation, no read-back per step"], fill="#eaf6ec",
    stroke="#2f7a3d")
arrow(300, 170, 200, 250)
arrow(680, 170, 800, 250)

# --- part 2: one decode step --------------------------------------------------------------
title(20, 392, "2. One decode step of one layer, for a batch of requests")
y = 420
box(20, y, 150, 96, ["engine", "per request: the new", "token's K, V, query,", "position (views in", "the exec's memory)"],
    fill="#f4f4f4", stroke="#666", size=12)
box(190, y, 210, 96, ["plan_decode(layer, tokens)", "host only: validate the batch,", "room, shapes, counts;",
                      "nothing changes", "-> decode_step"], size=12)
box(420, y, 200, 96, ["run_decode(step)", "two tiers: install recalled rows", "append each token (store)",
                      "sparse_read: select pages by q", "-> attention_plan"], size=12)
box(650, y, 150, 96, ["attention", "engine's kernel over", "the plan, or attend()", "(slots + original", "positions per KV head)"],
    fill="#f4f4f4", stroke="#666", size=12)
box(820, y, 140, 96, ["after_attention", "the schedule decides:", "evict / recall /", "select ahead;",
                      "shows next step"], size=12)
arrow(170, y + 48, 190, y + 48)
arrow(400, y + 48, 420, y + 48)
arrow(620, y + 48, 650, y + 48)
arrow(800, y + 48, 820, y + 48)
box(420, 560, 200, 44, ["Store", "rows, positions, host pool"], fill="#ffffff")
arrow(520, y + 96, 520, 560, "append / install", dx=50, dy=4)
out.append(f'<path d="M 890 {y + 96} L 890 582 L 620 582" fill="none" stroke="#333" marker-end="url(#a)"/>')
out.append(f'<text x="760" y="600" font-size="11" text-anchor="middle" fill="#444">'
           f'retain (evict) / recall via transfer (two tiers)</text>')
box(20, 560, 370, 64, ["evict's round (score -> budget -> select -> retain)",
                       "runs at the prompt's end in prefill(layer, chunks),",
                       "and after a step where the trigger fires"], fill="#ffffff", bold_first=False, size=12)
out.append('<text x="20" y="660" font-size="12" fill="#444">Every call is checked before any state '
           'changes; attend and after_attention must be the step the last decode planned.</text>')
out.append('<text x="20" y="680" font-size="12" fill="#444">docs/architecture.md explains '
           'each box; generated by docs/architecture_svg.py.</text>')

svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
       f'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
       '<defs><marker id="a" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto">'
       '<path d="M0,0 L10,4 L0,8 z" fill="#333"/></marker></defs>',
       f'<rect width="{W}" height="{H}" fill="#ffffff"/>'] + out + ['</svg>']
open("docs/architecture.svg", "w").write("\n".join(svg) + "\n")
