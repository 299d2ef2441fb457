"""A test helper: one function run on several Python threads at once."""

import threading
from collections.abc import Callable


def run_on_threads(target: Callable[[int], None], count: int, timeout: float = 120) -> None:
    """`target(k)` for k in [0, count), each on its own thread, all at once; fails when a
    thread is still running `timeout` seconds after the joins begin (a hang) or when one
    raised (the first error, re-raised here on the calling thread)."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            target(k)
        except BaseException as e:  # reported by the calling thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[0]
