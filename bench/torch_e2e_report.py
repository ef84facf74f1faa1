# SPDX-License-Identifier: Apache-2.0
"""bench/torch_e2e.py's result files as a Markdown table and a plot (--table, --plot)."""


def fmt_spread(entry, digits=3):
    return (f"{entry['median']:.{digits}f} ({entry['min']:.{digits}f}–{entry['max']:.{digits}f})"
            if entry["n"] > 1 else f"{entry['median']:.{digits}f}")


def cpu_cell(cpu):
    """The CPU seconds a step of a run's summary: the workers' together, then the shards'."""
    workers = sum(v for k, v in cpu.items() if k != "shards")
    return f"{workers:.3f}" + (f" + {cpu['shards']:.3f}" if "shards" in cpu else "")


def table(results):
    """Markdown: one row per model, rate and mode."""
    lines = ["| model | link | mode | s/step, median (range) | samples/s | DDP time / mode time "
             "| priority / fifo speed | CPU s/step: workers + shards | runs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for model in result["models"]:
            compute = model["compute"]["iteration_s"]
            lines.append(f"| {model['model']} | compute only | local | {compute:.3f} | "
                         f"{model['compute']['samples_per_s']:.1f} | | | "
                         f"{model['compute']['cpu_s_per_step_total']:.3f} | 1 |")
            for rate in model["rates"]:
                for mode, s in rate["summary"].items():
                    lines.append(
                        f"| {model['model']} | {rate['name']} | {mode} | "
                        f"{fmt_spread(s['iteration_s'])} | {s['samples_per_s']['median']:.1f} | "
                        f"{fmt_spread(s['ratio_to_ddp'], 2) if 'ratio_to_ddp' in s else ''} | "
                        f"{fmt_spread(s['ratio_to_fifo'], 2) if 'ratio_to_fifo' in s else ''} | "
                        f"{cpu_cell(s['cpu_s_per_step'])} | {s['iteration_s']['n']} |")
    return "\n".join(lines)


MODE_STYLE = {"priority": ("tab:blue", "s"), "fifo": ("tab:red", "o"), "ddp": ("tab:green", "^"),
              "priority+bf16": ("tab:cyan", "s"), "priority+fp16": ("tab:olive", "s"),
              "priority+topk": ("tab:purple", "D"), "priority+onebit": ("tab:pink", "D"),
              "ddp+fp16": ("tab:brown", "^")}


def plot(results, path):
    """Step time per mode against link rate (unshaped first, then slower links), one panel per
    model; the bars span the repeats' range, the dashed line is the compute-only time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = [m for r in results for m in r["models"]]
    figure, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        rates = sorted(model["rates"], key=lambda r: -(r["bits_per_s"] or float("inf")))
        for mode, (color, marker) in MODE_STYLE.items():
            points = [(i, r["summary"][mode]["iteration_s"]) for i, r in enumerate(rates)
                      if mode in r["summary"]]
            if not points:
                continue
            x = [i for i, _ in points]
            y = [s["median"] for _, s in points]
            spread = [[s["median"] - s["min"] for _, s in points],
                      [s["max"] - s["median"] for _, s in points]]
            ax.errorbar(x, y, yerr=spread, color=color, marker=marker, capsize=3, label=mode)
        ax.axhline(model["compute"]["iteration_s"], color="gray", linestyle="--",
                   label="compute only")
        ax.set_xticks(range(len(rates)), [r["name"] for r in rates])
        ax.set_title(f"{model['model']} ({model['param_bytes'] / 1e6:.0f} MB)")
        ax.set_xlabel("link, each way")
        ax.set_ylabel("s per step (median)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
