"""A pure-Python workload with a known call chain for the agent's tests.

    python3 hot.py <seconds> [sorted]

spins in py_hot, called as main -> py_outer -> py_middle -> py_inner -> py_hot,
for <seconds> of the process's CPU time (see hot.c). With `sorted`, spins in
py_key instead, called by the C function sorted() from py_sort (Python frames
on both sides of native ones).
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


def py_key(v):
    x = v
    for i in range(300):
        x = (x * 6364136223846793005 + i) & 0xFFFFFFFFFFFFFFFF
    return x


def py_sort(n):
    return sorted(range(n, n + 200), key=py_key)[0]


def main():
    until = time.process_time() + float(sys.argv[1])
    step = py_sort if sys.argv[2:] == ["sorted"] else py_outer
    n = 1
    while time.process_time() < until:
        n = step(n) & 0xFFFF
    return n


if __name__ == "__main__":
    main()
