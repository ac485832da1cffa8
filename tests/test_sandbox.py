"""The python tool's sandboxes: the local subprocess (ada/envs/sandbox.py) holds its limits,
and the SandboxFusion client (ada/envs/remote.py) reads a stand-in server's replies,
errors and silences. Every fault here is real: real code in a real child process, a real
HTTP server on a thread."""

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ada.envs import EnvConfig, ToolEnv
from ada.envs.parsers import ToolCall
from ada.envs.remote import run_remote
from ada.envs.sandbox import run_python

# Modules the child already holds at start-up, reached without an import statement: what
# code that gets around the allow-list would use.
SYS = "import collections; sys = collections._sys; "


def test_prints_and_exact_results():
    r = run_python("from fractions import Fraction\nprint(Fraction(1, 3) + Fraction(1, 6))")
    assert (r.output, r.error, r.truncated, r.returncode) == ("1/2\n", None, False, 0)


def test_the_child_cannot_read_the_parents_environment(monkeypatch):
    monkeypatch.setenv("ADA_FAKE_SECRET", "hunter2")
    r = run_python(SYS + "print(sorted(sys.modules['os'].environ.items()))")
    assert r.error is None and "hunter2" not in r.output and "ADA_FAKE_SECRET" not in r.output
    assert set(dict(eval(r.output))) <= {"PATH", "HOME", "LANG", "LC_ALL"}


@pytest.mark.parametrize("code", ["import socket", "import os\nos.system('echo pwned')",
                                  "from subprocess import run", "__import__('ctypes')"])
def test_imports_off_the_allow_list_are_refused(code):
    r = run_python(code)
    assert r.error == "forbidden" and "ImportError" in r.output and "pwned" not in r.output


def test_commands_and_forks_are_refused_even_without_an_import(tmp_path):
    marker = tmp_path / "pwned"
    for call in (f"system('touch {marker}')", "fork()", f"posix_spawn('/bin/touch', "
                 f"['touch', '{marker}'], {{}})", "execv('/bin/true', ['true'])"):
        r = run_python(SYS + f"sys.modules['os'].{call}")
        assert r.error == "forbidden" and "PermissionError" in r.output, (call, r)
    r = run_python(SYS + f"sys.modules['posix'].system('touch {marker}')")
    assert r.error == "forbidden" and not marker.exists()


def test_writes_stay_in_the_working_folder_which_is_removed(tmp_path):
    outside = tmp_path / "escaped.txt"
    r = run_python(f"open({str(outside)!r}, 'w').write('x')")
    assert r.error == "forbidden" and "outside the working folder" in r.output
    assert not outside.exists()
    r = run_python(SYS + "open('notes.txt', 'w').write('kept'); print(open('notes.txt').read()); "
                   "print(sys.modules['os'].getcwd())")
    assert r.error is None and r.output.startswith("kept\n")
    assert not os.path.exists(r.output.split()[1])  # the folder went with the run
    r = run_python(SYS + "sys.modules['os'].symlink('/tmp', 'link'); open('link/x', 'w')")
    assert r.error in ("forbidden", "error") and not os.path.exists("/tmp/x")


def test_a_caught_refusal_is_still_counted():
    r = run_python("try:\n    import socket\nexcept ImportError:\n    print('fine')")
    assert r.output == "fine\n" and r.error == "forbidden"


def test_wall_clock_and_cpu_limits_stop_the_run():
    t = time.monotonic()
    r = run_python(SYS + "sys.modules['time'].sleep(30)", timeout_s=0.5)  # no CPU used
    assert r.error == "timeout" and time.monotonic() - t < 3
    r = run_python("while True:\n    pass", timeout_s=0.5)
    assert r.error == "timeout" and r.seconds < 3


def test_a_huge_print_is_cut_while_reading():
    t = time.monotonic()
    r = run_python("print('x' * 10_000_000)\nprint('after')", max_output_bytes=1000)
    assert r.truncated and r.error is None and r.output == "x" * 1000
    assert time.monotonic() - t < 5


@pytest.mark.parametrize("code, needle", [
    ("1/0", "ZeroDivisionError"),
    ("def f(:\n    pass", "SyntaxError"),
    ("x = 'a' * (2 ** 32)", "MemoryError"),
    ("raise SystemExit(2)", ""),
])
def test_failures_are_errors_with_the_codes_traceback(code, needle):
    r = run_python(code)
    assert r.error == "error" and needle in r.output and "<string>" not in r.output
    if needle == "ZeroDivisionError":
        assert 'File "<code>", line 1' in r.output and "1/0" in r.output


def test_sympy_is_allowed_where_installed():
    pytest.importorskip("sympy")
    r = run_python("import sympy\nprint(sympy.factorint(360))")
    assert r.error is None and r.output == "{2: 3, 3: 2, 5: 1}\n"


# ----------------------------------------------------------------------------- SandboxFusion

OK = {"status": "Success", "message": "", "compile_result": None, "files": {},
      "run_result": {"status": "Finished", "execution_time": 0.01, "return_code": 0,
                     "stdout": "1024\n", "stderr": ""}}
REPLIES = {  # code -> (HTTP status, reply body)
    "print(2**10)": (200, OK),
    "1/0": (200, {"status": "Failed", "message": "", "run_result": {
        "status": "Finished", "return_code": 1, "stdout": "",
        "stderr": "Traceback (most recent call last):\nZeroDivisionError: division by zero\n"}}),
    "while True: pass": (200, {"status": "Failed", "message": "", "run_result": {
        "status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}}),
    "print('x' * 5000)": (200, {"status": "Success", "run_result": {
        "status": "Finished", "return_code": 0, "stdout": "x" * 5000, "stderr": ""}}),
    "sandbox": (200, {"status": "SandboxError", "message": "no runner left"}),
    "boom": (500, {"detail": "internal error"}),
    "garbage": (200, "this is not json"),
}


@pytest.fixture(scope="module")
def server():
    requests = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append((self.path, body))
            if body["code"] == "slow":
                time.sleep(1.0)
            status, reply = REPLIES.get(body["code"], (200, OK))
            data = (reply if isinstance(reply, str) else json.dumps(reply)).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up ("slow")
                pass

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", requests
    httpd.shutdown()
    httpd.server_close()


def test_remote_sends_sandboxfusions_request(server):
    url, requests = server
    r = run_remote("print(2**10)", url, timeout_s=3)
    assert (r.output, r.error, r.returncode) == ("1024\n", None, 0)
    path, body = requests[-1]
    assert path == "/run_code"
    assert body == {"code": "print(2**10)", "language": "python", "run_timeout": 3,
                    "compile_timeout": 3}


@pytest.mark.parametrize("code, error, needle", [
    ("1/0", "error", "ZeroDivisionError"),
    ("while True: pass", "timeout", ""),
    ("sandbox", "unavailable", "no runner left"),
    ("boom", "unavailable", "HTTP 500"),
    ("garbage", "unavailable", "not SandboxFusion's JSON"),
])
def test_remote_failures_become_kinds(server, code, error, needle):
    r = run_remote(code, server[0])
    assert r.error == error and needle in r.output


def test_remote_output_is_cut(server):
    r = run_remote("print('x' * 5000)", server[0], max_output_bytes=100)
    assert r.truncated and r.output == "x" * 100 and r.error is None


def test_remote_silence_and_no_server_are_unavailable(server):
    t = time.monotonic()
    r = run_remote("slow", server[0], timeout_s=0.1, slack_s=0.2)
    assert r.error == "unavailable" and "did not answer within 0.3 s" in r.output
    assert time.monotonic() - t < 0.9
    r = run_remote("print(1)", "http://127.0.0.1:9", timeout_s=0.5, slack_s=0.5)
    assert r.error == "unavailable" and "cannot be reached" in r.output


def test_the_python_tool_runs_remotely_with_a_sandbox_url(server):
    env = ToolEnv({"answer": "1024"}, None, EnvConfig(tools="python", sandbox_url=server[0]))
    code = env.format.render(ToolCall("python", {"code": "print(2**10)"}))
    turn = env.step(code)
    assert "\n1024\n\n</tool_response>" in turn.observation and turn.error is None
    turn = env.step(env.format.render(ToolCall("python", {"code": "boom"})))
    assert turn.error == "unavailable" and env.stats.errors == {"unavailable": 1}
