"""`ramen netd`: the network daemon of one site on one host, until SIGTERM/SIGINT.

It binds its receive endpoint (`--listen`, loopback and a free port by default: the one the site's
previous netd had, if it is free) and announces it in
the ephemeral `sites/<site>/net/endpoint` key, then turns one duty cycle: the key follower
(follower.py) applying the site's net/ keys, the sender agent sending local logs, the receiver
agent rebuilding received streams as local logs. Its counters, and its agents', are in the site's
counters file, where `ramen stat` shows them.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import threading
from pathlib import Path

from ramen import keyspace, liveness, paths, service_log
from ramen.cli import argtypes
from ramen.listen import parse_listen
from ramen.netd.contract import NetEndpoint
from ramen.netd.defaults import CONFSERVER_IDENTITY, DEFAULT_LISTEN, LAST_ENDPOINT_FILE
from ramen.netd.follower import KeyFollower, NetdCounters
from ramen.transport.counters import CountersFile
from ramen.transport.errors import TransportError
from ramen.transport.idle import BackoffIdleStrategy
from ramen.transport.udp.channel import Address, UdpChannel
from ramen.transport.udp.receiver_agent import ReceiverAgent
from ramen.transport.udp.sender_agent import SenderAgent
from ramen.transport.udp.setup_key import SetupKey, SetupKeyError

log = logging.getLogger(__name__)

EXIT_REFUSED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", metavar="HOST:PORT", default=DEFAULT_LISTEN,
                        help="the UDP endpoint other sites send to (default %(default)s: loopback, a free port)")
    parser.add_argument("--site", default=keyspace.default_site(), type=argtypes.site,
                        help="the site whose net/ keys to follow (default %(default)s)")
    parser.add_argument("--confserver", metavar="URL", help="default $RAMEN_CONFSERVER, else the local server")
    parser.add_argument("--allow", metavar="NETWORK", action="append", type=argtypes.network,
                        help="take datagrams only from this address or network (repeatable; default: any "
                             "address that reaches --listen); others are counted and dropped undecoded")
    parser.add_argument("--setup-key", metavar="FILE",
                        help="sign the SETUPs it sends with the secret in FILE, and take only SETUPs signed with "
                             "it: the same file on every site that sends to another (chmod 600)")


def serve(args: argparse.Namespace) -> int:
    import confserver
    from confserver.errors import ConfError

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before anything is acquired: a stop must be clean
        signal.signal(sig, lambda *_: stop.set())
    try:
        host, port = parse_listen(args.listen)
        setup_key = None if args.setup_key is None else SetupKey.load(args.setup_key)
    except (ValueError, SetupKeyError) as e:
        print(f"ramen: netd: {e}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        client = confserver.connect(args.confserver, identity=CONFSERVER_IDENTITY,
                                    connect_timeout_s=confserver.SERVICE_CONNECT_TIMEOUT_S)
    except (ConfError, OSError) as e:
        print(f"ramen: netd: cannot reach the confserver: {e}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        paths.ramen_dir().mkdir(parents=True, exist_ok=True)
        counters = CountersFile.open(paths.counters_path())
    except (TransportError, OSError) as e:
        client.close()
        print(f"ramen: netd: {e}", file=sys.stderr)
        return EXIT_REFUSED
    receiver = sender = follower = None
    netd_counters = NetdCounters.allocate(counters, args.site)
    try:
        receiver = ReceiverAgent(paths.net_dir(args.site), counters, receiver_id=random.getrandbits(31),
                                 allow=args.allow, setup_key=setup_key)
        try:
            bound = _bind(receiver, Address(host, port), paths.net_dir(args.site) / LAST_ENDPOINT_FILE)
        except OSError as e:
            print(f"ramen: netd: cannot listen on {args.listen}: {e.strerror or e}", file=sys.stderr)
            return EXIT_REFUSED
        endpoint = UdpChannel(endpoint=bound)
        sender = SenderAgent(counters, setup_key=setup_key)
        follower = KeyFollower(client, args.site, sender, receiver, endpoint, netd_counters)
        _announce(client, args.site, endpoint)
        log.info("netd of site %s receiving at %s", args.site, endpoint.format())
        run(stop, follower, sender, receiver)
    finally:
        for part in (follower, sender, receiver):
            if part is not None:
                part.close()
        netd_counters.close()
        counters.close()
        client.close()
    return 0


def _bind(receiver: ReceiverAgent, address: Address, remembered: Path) -> Address:
    """Bind `address`; for a free port, the one this site's previous netd had first, if it is
    still free: a netd restarted where it was keeps its senders' publications (a new endpoint would
    replace them, at their logs' tails, with the rows in between lost to an unarchived output) and
    goes on in the images it left (ReceiverAgent). The port bound is remembered in `remembered`."""
    bound = None
    if address.port == 0:
        try:
            previous = int(remembered.read_text())
            bound = receiver.bind(Address(address.host, previous))
        except (OSError, ValueError):
            pass  # none remembered, or taken now: a free one
    if bound is None:
        bound = receiver.bind(address)
    remembered.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomically(remembered, f"{bound.port}\n")
    return bound


def _announce(client, site: str, endpoint: UdpChannel) -> None:
    """The endpoint key, ephemeral: it goes with this process's session."""
    import confserver
    key = keyspace.net_endpoint_key(site)
    value = NetEndpoint(channel=endpoint.format(), pid=os.getpid()).to_value()
    try:
        client.create(key, value, ephemeral=True)
    except confserver.KeyExists:  # left by the session of a netd killed: make it ours
        client.discard(key)
        client.create(key, value, ephemeral=True)


def run(stop: threading.Event, follower: KeyFollower, sender: SenderAgent, receiver: ReceiverAgent,
        idle: BackoffIdleStrategy | None = None) -> None:
    idle = idle or BackoffIdleStrategy()
    while not stop.is_set():
        liveness.beat()  # for `ramen start`: this loop still turns
        idle.idle(follower.do_work() + sender.do_work() + receiver.do_work())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ramen netd", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    service_log.configure(logging.DEBUG if args.debug else logging.INFO)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
