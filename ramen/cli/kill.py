"""`ramen kill PROGRAM [--purge]`: unload a program; with --purge, delete its archives too."""

from __future__ import annotations

from ramen import keyspace, paths
from ramen.cli import conf
from ramen.cli.errors import UserError

IDENTITY = "user"


def add_parser(sub) -> None:
    parser = sub.add_parser("kill",
                            description="Unload a program: its workers stop once the choreographer and "
                                        "supervisor see it gone.")
    parser.add_argument("program", help="the program's name")
    parser.add_argument("--purge", action="store_true",
                        help="also delete every stopped recording of its functions in this site's archive")
    conf.add_arguments(parser, IDENTITY, site=True)
    parser.set_defaults(run=run)


def run(args) -> int:
    import confserver
    with conf.connected(args) as client:
        loaded = conf.loaded_programs(client)
        if args.program not in loaded:
            raise UserError(f"no program named {args.program} is loaded")
        for other in loaded.values():
            if other.name == args.program:
                continue
            for parent, child in other.edges():
                if parent.split("/", 1)[0] == args.program:
                    raise UserError(f"{child} reads {parent}: kill {other.name} first")
        try:
            client.delete(keyspace.program_key(args.program))
        except confserver.NoSuchKey:
            raise UserError(f"no program named {args.program} is loaded") from None
    print(f"killed {args.program}")
    if args.purge:
        purge(args.program, args.site)
    return 0


def purge(program: str, site: str) -> None:
    from ramen.archive.catalog import Catalog, CatalogError, RecordingState
    from ramen.archive.coverage import function_of_channel
    from ramen.archive.retention import RetentionError, delete_recording
    archive = paths.archive_dir(site)
    if not (archive / "archive.catalog").exists():
        print(f"no archive at {archive}: nothing to purge")
        return
    try:
        catalog = Catalog.open(archive, writable=True)
    except CatalogError as e:
        raise UserError(str(e)) from None
    deleted = 0
    with catalog:
        for descriptor in catalog.descriptors(states=(RecordingState.VALID,)):
            name = function_of_channel(descriptor.stripped_channel)
            if name is None or name.split("/", 1)[0] != program:
                continue
            try:
                delete_recording(catalog, descriptor.recording_id)
            except RetentionError as e:
                raise UserError(str(e)) from None
            deleted += 1
    print(f"purged {deleted} recording{'s' if deleted != 1 else ''} of {program} from {archive}")
