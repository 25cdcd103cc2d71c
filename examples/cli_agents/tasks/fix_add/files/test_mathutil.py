"""Run with: python3 test_mathutil.py (prints ok, or fails with an AssertionError)."""

from mathutil import add, double

assert add(2, 3) == 5, add(2, 3)
assert add(-1, 1) == 0, add(-1, 1)
assert double(4) == 8, double(4)
print("ok")
