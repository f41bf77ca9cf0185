"""`ramen supervisor`: run the supervisor service of one site (in the supervisor package).

The service is imported only when this command runs, so the core never depends on it.
"""


def add_parser(sub) -> None:
    parser = sub.add_parser("supervisor",
                            add_help=False,
                            description="Run the supervisor; `ramen supervisor --help` for its options.")
    parser.set_defaults(run=run, passthrough=True)


def run(args) -> int:
    from supervisor import service
    return service.main(args.args)
