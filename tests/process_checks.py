# SPDX-License-Identifier: Apache-2.0
"""What the process tests (tests/*_test.py) check with: a failed check raises AssertionError
with its message, and wait_until polls a condition until a deadline."""
import time


def fail(message):
    raise AssertionError(message)


def check(condition, message):
    if not condition:
        fail(message)


def wait_until(condition, what, timeout=120):
    """Returns once condition() is true; fails naming `what` after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.02)
    fail(f"timed out waiting for {what}")
