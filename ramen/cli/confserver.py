"""`ramen confserver`: run the built-in configuration server (in the confserver package).

The server is imported only when this command runs, so the core never depends on it.
"""


def add_parser(sub) -> None:
    parser = sub.add_parser("confserver",
                            add_help=False,
                            description="Run the built-in confserver; `ramen confserver --help` for its options.")
    parser.set_defaults(run=run, passthrough=True)


def run(args) -> int:
    from confserver import server
    return server.main(args.args)
