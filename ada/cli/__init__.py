"""Every command line of ada, each a thin `main` over library functions:

  train.py          python -m ada.runner (ada-train): train from a config, or a sweep
  eval.py           python -m ada.evaluate (ada-eval): avg@k / pass@k of a run or a model
  serve.py          python -m ada.serve (ada-serve): JetStream gRPC server of a run or a model
  plan.py           python -m ada.plan (ada-plan): will a config fit a TPU slice
  difficulty.py     python -m ada.data.difficulty: filter prompts by the policy's pass rate
  inspect_model.py  ada-inspect: describe a Hugging Face checkpoint from its headers

The `python -m` paths are kept by one-line modules at those places (ada/runner.py,
ada/evaluate.py, ...) that only call these. A user error ends a command with one
`error: ...` line and exit code 2 (`ada.errors.fail`). The top layer: a command may
import any module of ada, and nothing imports a command but its `python -m` shim.
"""
