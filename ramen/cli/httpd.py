"""`ramen httpd`: run the dashboards' HTTP service (ramen/httpd/service.py) until stopped."""


def add_parser(sub) -> None:
    parser = sub.add_parser("httpd", add_help=False,
                            description="Serve the Graphite API, /metrics and the dashboard page; "
                                        "`ramen httpd --help` for its options.")
    parser.set_defaults(run=run, passthrough=True)


def run(args) -> int:
    from ramen.httpd import service
    return service.main(args.args)
