"""`ramen netd`: run a site's network daemon (ramen/netd/service.py) until stopped."""


def add_parser(sub) -> None:
    parser = sub.add_parser("netd", add_help=False,
                            description="Send and receive the site's streams over UDP; `ramen netd --help` for its "
                                        "options.")
    parser.set_defaults(run=run, passthrough=True)


def run(args) -> int:
    from ramen.netd import service
    return service.main(args.args)
