"""`ramen confclient get|set|del|list|watch`: read and change the confserver's keys by hand.

Values are JSON; `set` takes a word that is not JSON as a string, so `set a/b hello` works.
"""

from __future__ import annotations

import json
import sys

from ramen.cli import conf
from ramen.program.durations import MICROS_PER_SECOND
from ramen.times import format_rfc3339

DEFAULT_IDENTITY = "admin"


def add_parser(sub) -> None:
    parser = sub.add_parser("confclient",
                            description="Read and change the keys of the confserver.")
    conf.add_arguments(parser, DEFAULT_IDENTITY)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    get = actions.add_parser("get", help="print one key's value; exit 1 if it is missing")
    get.add_argument("key")
    put = actions.add_parser("set", help="write a key (JSON value, or a plain word as a string)")
    put.add_argument("key")
    put.add_argument("value")
    put.add_argument("--create", action="store_true", help="fail if the key exists")
    put.add_argument("--version", type=int, help="write only if the key is at this version (compare-and-set)")
    delete = actions.add_parser("del", help="delete a key")
    delete.add_argument("key")
    delete.add_argument("--recursive", "-r", action="store_true", help="also every key below it")
    listing = actions.add_parser("list", help="keys matching a prefix or glob (`*`, `**`), with their values")
    listing.add_argument("key", nargs="?", default="", metavar="PATTERN")
    watch = actions.add_parser("watch", help="print the matching keys, then every change, until interrupted")
    watch.add_argument("key", metavar="PATTERN")
    for action in (get, put, delete, listing, watch):
        action.add_argument("--json", action="store_true", help="JSON output, one object per line")
    parser.set_defaults(run=run)


def run(args) -> int:
    with conf.connected(args) as client:
        return ACTIONS[args.action](client, args)


def _get(client, args) -> int:
    _print_entry(client.get(args.key), args.json)
    return 0


def _set(client, args) -> int:
    try:
        value = json.loads(args.value)
    except json.JSONDecodeError:
        value = args.value
    if args.create:
        entry = client.create(args.key, value)
    elif args.version is not None:
        entry = client.update(args.key, value, version=args.version)
    else:
        entry = client.set(args.key, value)
    _print_entry(entry, args.json)
    return 0


def _del(client, args) -> int:
    removed = client.delete_tree(args.key) if args.recursive else (client.delete(args.key) or 1)
    if args.json:
        print(json.dumps({"deleted": removed}))
    else:
        print(f"deleted {removed} key{'s' if removed != 1 else ''}")
    return 0


def _list(client, args) -> int:
    for entry in client.glob(args.key):
        _print_entry(entry, args.json)
    return 0


def _watch(client, args) -> int:
    import confserver
    with client.watch(args.key) as watch:
        for event in watch:
            if args.json:
                print(json.dumps(event.to_json()), flush=True)
            elif event.kind is confserver.EventKind.SYNCED:
                print(f"-- {args.key or 'all keys'}: in sync, now following changes", file=sys.stderr, flush=True)
            else:
                value = json.dumps(event.entry.value) if event.entry is not None else ""
                print(f"{event.kind.value:8} {event.key} = {value}", flush=True)
    return 0


def _print_entry(entry, as_json: bool) -> None:
    if as_json:
        print(json.dumps(entry.to_json()))
        return
    when = format_rfc3339(int(entry.mtime) * MICROS_PER_SECOND)  # to the second: a key's age, not its order
    flags = ", ephemeral" if entry.ephemeral else ""
    print(f"{entry.key} = {json.dumps(entry.value)}  (version {entry.version}, by {entry.owner}, {when}{flags})")


ACTIONS = {"get": _get, "set": _set, "del": _del, "list": _list, "watch": _watch}
