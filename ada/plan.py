"""`python -m ada.plan`: will a config fit a TPU slice, and how fast could it go (the command is ada/cli/plan.py)."""

if __name__ == "__main__":
    import sys

    from ada.cli.plan import main

    sys.exit(main())
