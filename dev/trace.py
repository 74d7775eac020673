#!/usr/bin/env python3
"""
The per-rank timelines of `train_gpt --trace DIR` (llmc/trace.h): merge them into one Chrome trace for
Perfetto (ui.perfetto.dev) or chrome://tracing (one process row per rank), print each rank's pipeline
bubble (time in the pipeline exchanges / step time, as --comm-report measures it), and draw them.

Usage: python3 dev/trace.py DIR [DIR ...] [--merge OUT.json] [--png OUT.png] [--steps A:B] [--title T ...]
  several DIRs: one panel each (e.g. 1F1B above GPipe); --steps picks the steps drawn (default: the 2nd)
"""
import argparse, json, os, re, sys

COLORS = {"forward": "#4c72b0", "backward": "#55a868", "weights": "#a6d854", "forward+backward": "#8172b2", "pipeline": "#c44e52",
          "optimizer": "#dd8452", "comm": "#937860", "io": "#da8bc3"}

def load(d):
    """{rank: [events]} from DIR/trace_RANK.json"""
    ranks = {}
    for name in os.listdir(d):
        m = re.fullmatch(r"trace_(\d+)\.json", name)
        if m:
            with open(os.path.join(d, name)) as f:
                ranks[int(m.group(1))] = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    if not ranks:
        sys.exit(f"{d}: no trace_RANK.json files")
    return dict(sorted(ranks.items()))

def inside(e, s):
    return e["ts"] >= s["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3

def bubble(events, steps):
    """mean over the given steps of (time in pipeline spans) / (step time)"""
    fr = []
    for s in steps:
        wait = sum(e["dur"] for e in events if e["cat"] == "pipeline" and inside(e, s))
        fr.append(wait / s["dur"])
    return sum(fr) / len(fr) if fr else 0.0

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--merge", help="write one merged Chrome trace (the first DIR)")
    ap.add_argument("--png", help="draw the timelines")
    ap.add_argument("--steps", default="1:2", help="steps drawn, A:B (0-based, B excluded)")
    ap.add_argument("--title", action="append", help="a title per DIR")
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.steps.split(":"))
    panels = []
    for i, d in enumerate(a.dirs):
        ranks = load(d)
        steps = {r: [e for e in ev if e["cat"] == "step"] for r, ev in ranks.items()}
        title = a.title[i] if a.title and i < len(a.title) else d
        print(f"{title}: pipeline bubble (time in the exchanges / step time), steps 2.. of the run:")
        for r, ev in ranks.items():
            print(f"  rank {r}: {bubble(ev, steps[r][1:]):.3f}  ({len(ev)} spans)")
        panels.append((title, ranks, steps))
        if a.merge and i == 0:
            with open(a.merge, "w") as f:
                json.dump({"traceEvents": [e for ev in ranks.values() for e in ev]}, f)
            print(f"wrote {a.merge}: open it in ui.perfetto.dev or chrome://tracing")
    if not a.png:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 1.2 + 0.9 * sum(len(p[1]) for p in panels) / len(panels) * len(panels)),
                             squeeze=False)
    for ax, (title, ranks, steps) in zip(axes[:, 0], panels):
        r0 = next(iter(ranks))
        if len(steps[r0]) < hi:
            sys.exit(f"{title}: only {len(steps[r0])} steps traced")
        t0, t1 = steps[r0][lo]["ts"], steps[r0][hi - 1]["ts"] + steps[r0][hi - 1]["dur"]
        for row, (r, ev) in enumerate(ranks.items()):
            y = len(ranks) - 1 - row
            for e in ev:
                if e["cat"] in ("step", "comm") or e["ts"] + e["dur"] < t0 or e["ts"] > t1:
                    continue
                ax.broken_barh([((e["ts"] - t0) / 1e3, e["dur"] / 1e3)], (y - 0.4, 0.8), facecolors=COLORS.get(e["cat"], "#999999"),
                               edgecolor="white", linewidth=0.3)
                if e["cat"] in ("forward", "backward", "weights") and "micro" in e.get("args", {}) and e["dur"] / (t1 - t0) > 0.02:
                    ax.text((e["ts"] - t0 + e["dur"] / 2) / 1e3, y, str(e["args"]["micro"]), ha="center", va="center", fontsize=6, color="white")
        ax.set_yticks(range(len(ranks)))
        ax.set_yticklabels([f"rank {r}" for r in reversed(list(ranks))])
        ax.set_xlim(0, (t1 - t0) / 1e3)
        ax.set_title(title, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms")
    cats = ["forward", "backward", "weights", "forward+backward", "pipeline", "optimizer"]
    fig.legend(handles=[Patch(color=COLORS[c], label={"forward+backward": "head + loss", "pipeline": "pipeline exchange / wait",
                                                      "backward": "backward (ZB: B)", "weights": "ZB: W"}.get(c, c))
                        for c in cats], loc="lower center", ncol=len(cats), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(a.png, dpi=110)
    print(f"wrote {a.png}")

if __name__ == "__main__":
    main()
