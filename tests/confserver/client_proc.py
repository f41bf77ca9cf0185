"""A confserver client in its own process, for tests that kill -9 a client.

    python -m tests.confserver.client_proc URL AUTH_FILE IDENTITY ACTION KEY [N]

ACTION is `lock` (take KEY's lock), `ephemeral` (create KEY as an ephemeral key) or `sequence`
(draw N numbers from KEY and print them). It prints `ready` once done, then waits to be killed
(except `sequence`, which exits).
"""

import sys
import time

import confserver

SESSION_TIMEOUT_S = 1.5


def main() -> None:
    url, auth_file, identity, action, key = sys.argv[1:6]
    client = confserver.connect(url, identity=identity, auth_file=auth_file, session_timeout_s=SESSION_TIMEOUT_S)
    if action == "sequence":
        values = [client.next_sequence(key) for _ in range(int(sys.argv[6]))]
        print(" ".join(map(str, values)), flush=True)
        client.close()
        return
    if action == "lock":
        client.lock(key, timeout_s=30)
    elif action == "ephemeral":
        client.create(key, "mine", ephemeral=True)
    print("ready", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
