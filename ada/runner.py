"""`python -m ada.runner`: train from a config, or run a sweep (the command is ada/cli/train.py)."""

if __name__ == "__main__":
    import sys

    from ada.cli.train import main

    sys.exit(main())
