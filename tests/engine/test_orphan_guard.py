"""braid.engine.orphan_guard's watch, in real processes: a child whose parent is SIGKILLed ends.

(The real engine core under it: tests/deploy/test_shared_replicas.py kills a replica and checks
that its engine core ends.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.helpers import process_running

# The parent starts a child that watches it as the engine core does, prints the child's pid,
# and waits. The child ignores nothing: SIGTERM ends it.
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", '''
    import time
    from braid.engine.orphan_guard import watch_parent
    watch_parent()
    time.sleep(60)
    '''])
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def test_a_child_that_watches_its_parent_ends_when_the_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(1.5)  # the parent alive: the child stays
        assert process_running(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while process_running(child):
            assert time.monotonic() < deadline, "the child outlived its killed parent"
            time.sleep(0.1)
    finally:
        parent.kill()
        if child is not None and process_running(child):
            os.kill(child, signal.SIGKILL)
