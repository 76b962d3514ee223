# mitmproxy addon for the keygate benchmark: the same rule as keygate's and squid's
# (replace Authorization on bench.test and *.bench.test), plus the name pinning the other proxies
# get from --resolve / hosts_file (every *.test name dials the loopback origin; SNI and
# certificate verification still use the name).
import os

from mitmproxy import http

TOKEN = os.environ["BENCH_TOKEN"]


def _bench_host(host: str) -> bool:
    return host == "bench.test" or host.endswith(".bench.test")


class Bench:
    def server_connect(self, data):
        host, port = data.server.address
        if host.endswith(".test"):
            data.server.address = ("127.0.0.1", port)

    def request(self, flow: http.HTTPFlow) -> None:
        if _bench_host(flow.request.pretty_host):
            # Assignment replaces every existing value of the field.
            flow.request.headers["Authorization"] = "Bearer " + TOKEN


addons = [Bench()]
