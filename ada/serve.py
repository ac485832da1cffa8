"""`python -m ada.serve`: serve a run or a Hugging Face model over JetStream's gRPC (the command is ada/cli/serve.py)."""

if __name__ == "__main__":
    import sys

    from ada.cli.serve import main

    sys.exit(main())
