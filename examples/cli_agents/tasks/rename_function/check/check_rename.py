"""Checks the run's folder (the current directory): the function is named greet in
greetings.py, say_hello appears in no Python file, and main.py still prints the greeting."""

import pathlib
import subprocess
import sys

sys.path.insert(0, ".")
import greetings

assert callable(getattr(greetings, "greet", None)), "greetings.greet is missing"
assert greetings.greet("x") == "Hello, x!", greetings.greet("x")
left = [str(p) for p in pathlib.Path(".").rglob("*.py") if "say_hello" in p.read_text()]
assert not left, f"say_hello is still in {left}"
out = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, check=True)
assert out.stdout == "Hello, world!\n", out.stdout
print("ok")
