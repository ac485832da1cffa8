"""A deterministic test reward for tests/test_multihost.py, a function of the text only:
'easy' prompts are mostly solved (they exit in round 1), 'hard' ones never."""

import hashlib


def reward(record, text):
    if not record["problem"].startswith("easy"):
        return 0.0
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
    return 1.0 if h % 4 else 0.0
