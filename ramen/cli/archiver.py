"""`ramen archiver`: run the archiver service of one archive directory (in workers.archiver).

The service is imported only when this command runs, so the core never depends on workers.
"""

def add_parser(sub) -> None:
    parser = sub.add_parser("archiver", add_help=False,
                            description="Run the archiver service; `ramen archiver --help` for its options.")
    parser.set_defaults(run=run, passthrough=True)


def run(args) -> int:
    from workers import archiver
    return archiver.main(args.args)
