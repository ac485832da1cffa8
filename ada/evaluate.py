"""`python -m ada.evaluate`: avg@k / pass@k of a run or a Hugging Face model (the command is ada/cli/eval.py)."""

if __name__ == "__main__":
    import sys

    from ada.cli.eval import main

    sys.exit(main())
