"""The dashboards' end-to-end tests share one site, started once for this package and stopped
after its last test (not at the end of the run: other suites count the host's processes)."""

import pytest


@pytest.fixture(scope="package")
def dashboard_site(tmp_path_factory):
    """ramen with its httpd over an archived generator with factors (tests/e2e/dashboards/site.py)."""
    from tests.e2e.dashboards.site import DashboardSite
    site = DashboardSite(tmp_path_factory.mktemp("dashboards"))
    try:
        yield site.start()
    finally:
        site.stop()
