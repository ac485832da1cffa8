"""Sweep: the three compared methods x three seeds on the embedded default task.

  python -m ada.runner --sweep configs/sweep_methods.py --workdir runs/sweep --print
      prints one command per run;
  python -m ada.runner --sweep configs/sweep_methods.py --workdir runs/sweep
      runs them one after another (each in runs/sweep/<method=...,seed=...>).
"""

BASE = "configs/default.py"


def get_sweep(arg=None):
    methods = ("grpo", "ada_pos", "ada_balance")
    seeds = (0, 1, 2) if arg is None else tuple(int(s) for s in arg.split(","))
    return [{"method": m, "seed": s} for m in methods for s in seeds]
