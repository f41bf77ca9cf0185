"""`ramen choreographer`: run the choreographer service (in the choreographer package).

The service is imported only when this command runs, so the core never depends on it.
"""


def add_parser(sub) -> None:
    parser = sub.add_parser("choreographer", add_help=False,
                            description="Run the choreographer; `ramen choreographer --help` for its options.")
    parser.set_defaults(run=run, passthrough=True)


def run(args) -> int:
    from choreographer import service
    return service.main(args.args)
