"""The `python` tool on a remote sandbox: SandboxFusion's HTTP API (the service verl uses), so
that a pod runs the policy's code in containers of its own rather than beside the trainer.

    POST {url}/run_code  {"code": ..., "language": "python", "run_timeout": s, "compile_timeout": s}
    -> {"status": "Success" | "Failed" | "SandboxError", "message": ...,
        "run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error",
                       "stdout": ..., "stderr": ..., "return_code": ..., "execution_time": ...}}

The reply becomes a SandboxResult as the local sandbox's (ada/envs/sandbox.py): stdout then
stderr, cut to `max_output_bytes`; "TimeLimitExceeded" is `timeout`, a non-zero return
code or a run error is `error`, and anything the service itself got wrong (an HTTP error, no
reply within the run's time plus `slack_s`, a reply that is not the JSON above,
"SandboxError") is `unavailable`: not the policy's doing. Only the standard library.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

from ada.envs.sandbox import MAX_OUTPUT_BYTES, SandboxResult

MAX_REPLY_BYTES = 16 << 20  # a reply is read up to this; a longer one is not parsed
RUN_ERRORS = {"TimeLimitExceeded": "timeout", "Error": "error"}


def run_remote(code: str, url: str, *, timeout_s: float = 5.0,
               max_output_bytes: int = MAX_OUTPUT_BYTES, slack_s: float = 10.0) -> SandboxResult:
    """Run `code` on the SandboxFusion service at `url`; never raises."""
    start = time.monotonic()
    body = json.dumps({"code": code, "language": "python", "run_timeout": timeout_s,
                       "compile_timeout": timeout_s}).encode()
    request = urllib.request.Request(url.rstrip("/") + "/run_code", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})

    def result(text: str, error: str | None, truncated: bool = False, rc: int | None = None):
        return SandboxResult(text, error, truncated, time.monotonic() - start, rc)

    try:
        with urllib.request.urlopen(request, timeout=timeout_s + slack_s) as reply:
            raw = reply.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as e:
        return result(f"the sandbox service answered HTTP {e.code} ({e.reason})", "unavailable")
    except (TimeoutError, socket.timeout):
        return result(f"the sandbox service did not answer within {timeout_s + slack_s:g} s",
                      "unavailable")
    except (urllib.error.URLError, OSError) as e:
        return result(f"the sandbox service cannot be reached ({getattr(e, 'reason', e)})",
                      "unavailable")
    if len(raw) > MAX_REPLY_BYTES:
        return result(f"the sandbox's reply is over {MAX_REPLY_BYTES} bytes (the code printed "
                      "too much)", "error", truncated=True)
    try:
        reply = json.loads(raw)
        run = reply.get("run_result") or {}
        status = reply["status"]
    except (ValueError, AttributeError, KeyError, TypeError):
        return result("the sandbox service sent a reply that is not SandboxFusion's JSON",
                      "unavailable")
    if status == "SandboxError" or not isinstance(run, dict):
        return result(f"the sandbox service failed: {str(reply.get('message'))[:200]}",
                      "unavailable")
    out = (str(run.get("stdout") or "") + str(run.get("stderr") or "")).encode("utf-8", "replace")
    text = out[:max_output_bytes].decode("utf-8", "replace")
    rc = run.get("return_code")
    error = RUN_ERRORS.get(run.get("status")) or ("error" if rc or status != "Success" else None)
    return result(text, error, len(out) > max_output_bytes, rc if isinstance(rc, int) else None)
