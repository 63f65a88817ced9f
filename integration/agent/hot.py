"""A pure-Python workload with a known call chain for the agent's tests.

    python3 hot.py <seconds>

spins in py_hot, called as main -> py_outer -> py_middle -> py_inner -> py_hot,
for <seconds> of the process's CPU time (see hot.c).
"""

import sys
import time


def py_hot(n):
    x = n
    for i in range(20000):
        x = (x * 6364136223846793005 + i) & 0xFFFFFFFFFFFFFFFF
    return x


def py_inner(n):
    return py_hot(n) ^ 1


def py_middle(n):
    return py_inner(n) ^ 2


def py_outer(n):
    return py_middle(n) ^ 3


def main():
    until = time.process_time() + float(sys.argv[1])
    n = 1
    while time.process_time() < until:
        n = py_outer(n)
    return n


if __name__ == "__main__":
    main()
