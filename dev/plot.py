"""
Plots train and validation loss from train_gpt's (or llm.c's) main.log files, one colour per run.

main.log lines: "s:STEP trl:LOSS" (train loss of step STEP), "s:STEP tel:LOSS" (validation loss
before step STEP) and "s:STEP eval:ACC" (HellaSwag's accuracy, --hellaswag: drawn in a second panel, as llm.c's
plot does); any other line is skipped. A resumed run appends to its log: for a step logged
twice the later line wins.

  .venv/bin/python dev/plot.py out/tinyshakespeare/main.log -o loss.png
  .venv/bin/python dev/plot.py runA/main.log runB/main.log --label "B=8" --label "B=16" --tokens-per-step 1024,2048

Train loss is a thin line (smoothed with --smooth N, a running mean over N steps), validation loss
a thicker line with dots, in the run's colour. --tokens-per-step puts tokens on the x axis (one
value for every run, or one per run, comma-separated).

--moe-load draws a MoE run's load instead: one heat map per MoE layer, expert x step, each cell the
expert's assignments (before drops) over the mean, from main.log's "s:STEP moeL:... load c0,c1,..."
lines (one log).

  .venv/bin/python dev/plot.py --moe-load out/moe/main.log -o load.png
"""

import argparse
import os
import re
import sys

LINE = re.compile(r"^s:(\d+) (trl|tel|eval):([-+0-9.eE]+|nan|inf)\s*$")
LOAD = re.compile(r"^s:(\d+) moe(\d+):.* load ([0-9,]+)\s*$")


def read_log(path):
    """Returns ({step: train loss}, {step: val loss}, {step: HellaSwag accuracy}) of one main.log."""
    logs = {"trl": {}, "tel": {}, "eval": {}}
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                logs[m.group(2)][int(m.group(1))] = float(m.group(3))
    return logs["trl"], logs["tel"], logs["eval"]


def read_moe_load(path):
    """Returns {layer: {step: [assignments per expert]}} of one main.log (the later line of a step wins)."""
    loads = {}
    with open(path) as f:
        for line in f:
            m = LOAD.match(line)
            if m:
                loads.setdefault(int(m.group(2)), {})[int(m.group(1))] = [int(x) for x in m.group(3).split(",")]
    return loads


def plot_moe_load(a, plt):
    """One heat map per MoE layer: expert (rows) x step (columns), load / mean load."""
    loads = read_moe_load(a.logs[0])
    if not loads:
        sys.exit(f"{a.logs[0]} has no MoE load lines (s:STEP moeL:... load ...)")
    layers = sorted(loads)
    fig, axes = plt.subplots(len(layers), 1, figsize=(8, 1.2 + 1.1 * len(layers)), dpi=100, squeeze=False,
                             layout="constrained")
    for ax, layer in zip(axes[:, 0], layers):
        steps = sorted(loads[layer])
        grid = [[loads[layer][s][e] * len(loads[layer][s]) / max(sum(loads[layer][s]), 1) for s in steps]
                for e in range(len(loads[layer][steps[0]]))]
        im = ax.imshow(grid, aspect="auto", cmap="coolwarm", vmin=0.0, vmax=2.0, interpolation="nearest",
                       extent=(steps[0] - 0.5, steps[-1] + 0.5, len(grid) - 0.5, -0.5))
        ax.set_ylabel(f"MoE layer {layer}\nexpert")
        worst = max(max(row[i] for row in grid) for i in range(len(steps)))
        print(f"MoE layer {layer}: {len(steps)} steps, {len(grid)} experts; max/mean at the last step "
              f"{max(row[-1] for row in grid):.2f}, over all steps {worst:.2f}")
    axes[-1, 0].set_xlabel("step")
    fig.colorbar(im, ax=axes[:, 0].tolist(), label="assignments / mean")
    if a.title:
        axes[0, 0].set_title(a.title)
    fig.savefig(a.out)
    print(f"wrote {a.out}")


def running_mean(ys, n):
    if n <= 1:
        return ys
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= n:
            acc -= ys[i - n]
        out.append(acc / min(i + 1, n))
    return out


def default_label(path):
    """The run's directory name (main.log itself says nothing)."""
    d = os.path.dirname(os.path.abspath(path))
    return os.path.basename(d) or path


def main():
    p = argparse.ArgumentParser(description="plot train/val loss of main.log files")
    p.add_argument("logs", nargs="+", help="main.log files (one run each)")
    p.add_argument("-o", "--out", default="loss.png", help="output PNG (default loss.png)")
    p.add_argument("--label", action="append", help="a run's label, once per log in order (default: each log's directory)")
    p.add_argument("--tokens-per-step", help="x axis in tokens: one number, or one per log, comma-separated")
    p.add_argument("--smooth", type=int, default=1, help="running mean of the train loss over N steps")
    p.add_argument("--title", default=None)
    p.add_argument("--ymax", type=float, default=None, help="upper y limit (the first steps can dwarf the rest)")
    p.add_argument("--moe-load", action="store_true", help="draw the MoE layers' load per expert and step (one log)")
    a = p.parse_args()
    if a.moe_load:
        if len(a.logs) != 1:
            sys.exit("--moe-load draws one log")
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plot_moe_load(a, plt)
        return

    labels = a.label if a.label else [default_label(x) for x in a.logs]
    if len(labels) != len(a.logs):
        sys.exit(f"{len(labels)} labels for {len(a.logs)} logs")
    tps = None
    if a.tokens_per_step:
        tps = [float(x) for x in a.tokens_per_step.split(",")]
        if len(tps) == 1:
            tps = tps * len(a.logs)
        if len(tps) != len(a.logs):
            sys.exit(f"{len(tps)} --tokens-per-step values for {len(a.logs)} logs")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = [read_log(path) for path in a.logs]
    evals = any(e for _, _, e in logs)
    fig, axes = plt.subplots(1, 2 if evals else 1, figsize=(12 if evals else 7, 4.2), dpi=100, squeeze=False)
    ax = axes[0, 0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (path, label) in enumerate(zip(a.logs, labels)):
        train, val, ev = logs[i]
        if ev:
            steps = sorted(ev)
            axes[0, 1].plot([s * (tps[i] if tps else 1.0) for s in steps], [ev[s] for s in steps],
                            color=colors[i % len(colors)], lw=2.0, marker="o", ms=4, label=label)
            print(f"{label}: {len(ev)} HellaSwag points; last {ev[max(ev)]:.4f}")
        if not train and not val:
            print(f"warning: {path} has no 's:STEP trl:' or 's:STEP tel:' lines", file=sys.stderr)
            continue
        scale = tps[i] if tps else 1.0
        c = colors[i % len(colors)]
        if train:
            steps = sorted(train)
            ys = running_mean([train[s] for s in steps], a.smooth)
            ax.plot([s * scale for s in steps], ys, color=c, lw=0.9, alpha=0.75, label=f"{label} train")
        if val:
            steps = sorted(val)
            ax.plot([s * scale for s in steps], [val[s] for s in steps], color=c, lw=2.0, marker="o", ms=4,
                    label=f"{label} val")
        last = f"train {train[max(train)]:.3f}" if train else ""
        if val:
            last += f"{', ' if last else ''}val {val[max(val)]:.3f}"
        print(f"{label}: {len(train)} train points, {len(val)} val points; last {last}")
    ax.set_xlabel("tokens" if tps else "step")
    ax.set_ylabel("loss (nats/token)")
    if a.ymax is not None:
        ax.set_ylim(top=a.ymax)
    if a.title:
        ax.set_title(a.title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    if evals:
        axes[0, 1].set_xlabel("tokens" if tps else "step")
        axes[0, 1].set_ylabel("HellaSwag accuracy (acc_norm)")
        axes[0, 1].grid(True, alpha=0.3)
        axes[0, 1].legend()
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
