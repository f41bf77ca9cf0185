"""A stand-in for workers.worker and workers.replayer in the supervisor's tests.

    python fake_process.py MODE [--site S] [--function P/F | --id N]

MODE `by-name` takes the mode from the function's name (`p/crash_x` crashes), so one command
prefix serves workers of several behaviours:
- sleep: run until SIGTERM, then exit 0;
- stubborn: ignore SIGTERM (only SIGKILL ends it);
- crash: exit 1 at once;
- done: exit 0 at once.
It prints `ready <pid>` and the environment it was given once its signal handlers are in place.
A worker (`--function`) holds the writer lock of its output log while it runs, as a real one does
(the supervisor adopts workers by it).
"""

import fcntl
import os
import signal
import sys
import time

MODES = ("sleep", "stubborn", "crash", "done")


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "by-name":
        function = argv[argv.index("--function") + 1] if "--function" in argv else ""
        leaf = function.rpartition("/")[2]
        mode = next((m for m in MODES if leaf.startswith(m)), "sleep")
    if mode == "crash":
        return 1
    if mode == "done":
        return 0
    if "--function" in argv:
        hold_output_log(argv[argv.index("--site") + 1], argv[argv.index("--function") + 1])
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"ready {os.getpid()} RAMEN_DIR={os.environ.get('RAMEN_DIR')} "
          f"RAMEN_CONFSERVER={os.environ.get('RAMEN_CONFSERVER')}", flush=True)
    while True:
        time.sleep(0.1)


HELD = []


def hold_output_log(site: str, function: str) -> None:
    """Lock the function's output log (ramen/paths.py output_log) for as long as we live."""
    path = os.path.join(os.environ["RAMEN_DIR"], "sites", site, "logs", f"{function}.logbuffer")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    HELD.append(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
