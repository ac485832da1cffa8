"""The run as one object: a training run assembled from its config and driven step by step.

  build.py      the composition root: config -> Setup (task, tokenizer, model, mesh,
                samplers, train functions); the dataclasses are built here and passed down
  policy.py     tokenizer, model config and initial params (HF, seeded init, warm start)
  passrates.py  the data.pass_rate_range filter and its cache key
  saved.py      load_run: a run directory -> its policy (eval, serve, the difficulty filter)
  folder.py     the run folder: resume checks, config history, summary, the files written
  state.py      RunState: everything a resume needs, saved and restored whole
  trainer.py    Trainer: restore, step, evaluate, save, close (the seam tools use)

May import: config and every layer below it (step, stream and ada.run's own modules sit
in the same layer); never the loop, the planner or ada/cli (tests/test_layout.py).
"""
