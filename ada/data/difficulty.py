"""`python -m ada.data.difficulty`: filter a prompt file by the policy's pass rate (the command is ada/cli/difficulty.py)."""

if __name__ == "__main__":
    import sys

    from ada.cli.difficulty import main

    sys.exit(main())
