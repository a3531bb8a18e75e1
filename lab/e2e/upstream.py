"""The upstream Kubernetes `[sig-network]` e2e tests ebpflb reproduces offline (issue 24):
one row per upstream test, in docs/e2e.md's order, by the name Ginkgo prints.

A row is ported by the tests in tests/kernel/e2e marked `@pytest.mark.upstream(<name>)`
(tests/unit/lab/e2e/test_upstream.py keeps both in step: every row not marked "not yet"
has a test, every e2e test names a row). A row without a port says why (`not_yet`); a row
whose port shows where ebpflb deliberately differs from upstream says how (`differs`).
Nothing here states a result: the table's result columns come from the runs' JUnit files.
"""

from __future__ import annotations

from dataclasses import dataclass

S = "[sig-network] Services "
G = "[sig-network] Networking Granular Checks: Services "
N = "[sig-network] Networking "
C = "[sig-network] Conntrack "
K = "[sig-network] KubeProxy "
AFFINITY_TIMEOUT_DIFFERS = (
    "timeoutSeconds 2 and pauses of timeout + 1 s, shorter than upstream's (its timeout and"
    " timeout + 5 s pauses would cost minutes): the same steps, 15 sticky requests, then up"
    " to 10 tries with a pause after each same-pod answer, until another pod answers"
)

EPERM_BEFORE_5_18 = (
    "on kernels before 5.18 (the 5.10 column) a pod that socket-LB serves gets EPERM at once,"
    " not ECONNREFUSED: a connect hook without bpf_set_retval can refuse but not choose the"
    " errno; the per-packet path's RST gives ECONNREFUSED on every kernel"
)


@dataclass(frozen=True, slots=True)
class Row:
    source: str  # the upstream file under test/e2e/network
    name: str  # the full upstream name, as Ginkgo prints it
    differs: str = ""  # where ebpflb deliberately differs from upstream, and what shows it
    not_yet: str = ""  # why no test ports it yet

    @property
    def ported(self) -> bool:
        return not self.not_yet


ROWS: tuple[Row, ...] = (
    # service.go, [Conformance]
    Row("service.go", S + "should serve a basic endpoint from pods [Conformance]"),
    Row("service.go", S + "should serve multiport endpoints from pods [Conformance]"),
    Row(
        "service.go",
        S + "should serve endpoints on same port and different protocols [Conformance]",
    ),
    Row("service.go", S + "should be able to create a functioning NodePort service [Conformance]"),
    Row(
        "service.go",
        S + "should be able to change the type from ExternalName to ClusterIP [Conformance]",
    ),
    Row(
        "service.go",
        S + "should be able to change the type from ExternalName to NodePort [Conformance]",
    ),
    Row(
        "service.go",
        S + "should be able to change the type from ClusterIP to ExternalName [Conformance]",
        differs="the CNAME lookup is DNS's part, not a proxy's: the port checks the ClusterIP"
        " stops answering and leaves every node's maps",
    ),
    Row(
        "service.go",
        S + "should be able to change the type from NodePort to ExternalName [Conformance]",
        differs="the API releases the nodePort; the port checks it stops answering and leaves"
        " every node's maps (ebpflb holds no socket on a nodePort)",
    ),
    Row(
        "service.go",
        S + "should have session affinity work for service with type clusterIP [LinuxOnly]"
        " [Conformance]",
    ),
    Row(
        "service.go",
        S + "should have session affinity work for NodePort service [LinuxOnly] [Conformance]",
    ),
    Row(
        "service.go",
        S + "should be able to switch session affinity for service with type clusterIP"
        " [LinuxOnly] [Conformance]",
    ),
    Row(
        "service.go",
        S + "should be able to switch session affinity for NodePort service [LinuxOnly]"
        " [Conformance]",
    ),
    # service.go, the rest of what CI's `\[sig-network\]` focus runs
    Row("service.go", S + "should be updated after adding or deleting ports"),
    Row(
        "service.go",
        S + "should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]",
    ),
    Row("service.go", S + "should allow pods to hairpin back to themselves through services"),
    Row("service.go", S + "should be able to up and down services"),
    Row("service.go", S + "should work after the service has been recreated"),
    Row("service.go", S + "should work after restarting kube-proxy [Disruptive]"),
    Row("service.go", S + "should work after restarting apiserver [Disruptive]"),
    Row(
        "service.go",
        S + "should be possible to connect to a service via ExternalIP when the external IP is"
        " not assigned to a node",
        differs="ebpflb programs no external IP outside --external-ip-cidrs, none by default"
        " (CVE-2020-8554, as the DenyServiceExternalIPs admission plugin): the port passes"
        " with 203.0.113.0/24 allowed and shows an address outside it never programmed",
    ),
    Row(
        "service.go",
        S + "should be able to update service type to NodePort listening on same port number"
        " but different protocols",
    ),
    Row("service.go", S + "should create endpoints for unready pods"),
    Row(
        "service.go",
        S + "should be able to connect to terminating and unready endpoints if"
        " PublishNotReadyAddresses is true",
    ),
    Row(
        "service.go",
        S + "should not be able to connect to terminating and unready endpoints if"
        " PublishNotReadyAddresses is false",
    ),
    Row(
        "service.go",
        S + "should have session affinity timeout work for service with type clusterIP [LinuxOnly]",
        differs=AFFINITY_TIMEOUT_DIFFERS,
    ),
    Row(
        "service.go",
        S + "should have session affinity timeout work for NodePort service [LinuxOnly]",
        differs=AFFINITY_TIMEOUT_DIFFERS,
    ),
    Row("service.go", S + "should implement service.kubernetes.io/service-proxy-name"),
    Row("service.go", S + "should implement service.kubernetes.io/headless"),
    Row("service.go", S + "should be rejected when no endpoints exist", differs=EPERM_BEFORE_5_18),
    Row(
        "service.go",
        S + "should be rejected for evicted pods (no endpoints exist)",
        differs=EPERM_BEFORE_5_18,
    ),
    Row("service.go", S + "should respect internalTrafficPolicy=Local Pod to Pod"),
    Row(
        "service.go",
        S + "should respect internalTrafficPolicy=Local Pod (hostNetwork: true) to Pod",
    ),
    Row(
        "service.go",
        S + "should respect internalTrafficPolicy=Local Pod and Node, to Pod (hostNetwork: true)",
    ),
    Row(
        "service.go",
        S + "should fail health check node port if there are only terminating endpoints",
    ),
    Row(
        "service.go",
        S + "should fallback to terminating endpoints when there are no ready endpoints with"
        " internalTrafficPolicy=Cluster",
    ),
    Row(
        "service.go",
        S + "should fallback to local terminating endpoints when there are no ready endpoints"
        " with internalTrafficPolicy=Local",
    ),
    Row(
        "service.go",
        S + "should fallback to terminating endpoints when there are no ready endpoints with"
        " externallTrafficPolicy=Cluster",
    ),
    Row(
        "service.go",
        S + "should fallback to local terminating endpoints when there are no ready endpoints"
        " with externalTrafficPolicy=Local",
    ),
    Row(
        "service.go",
        S + "should allow creating a basic SCTP service with pod and endpoints [LinuxOnly]"
        " [Serial]",
    ),
    # conntrack.go
    Row(
        "conntrack.go",
        C + "should be able to preserve UDP traffic when server pod cycles for a NodePort service",
    ),
    Row(
        "conntrack.go",
        C + "should be able to preserve UDP traffic when server pod cycles for a ClusterIP service",
    ),
    Row(
        "conntrack.go",
        C + "should be able to preserve UDP traffic when server pod cycles for a ClusterIP"
        " service and client is hostNetwork",
    ),
    Row(
        "conntrack.go",
        C + "should be able to preserve UDP traffic when server pod cycles for a ClusterIP"
        " service with InternalTrafficPolicy set to Local",
    ),
    Row(
        "conntrack.go",
        C + "should be able to preserve UDP traffic when initial unready endpoints get ready",
    ),
    Row("conntrack.go", C + "should drop INVALID conntrack entries [Privileged]"),
    # networking.go
    Row("networking.go", G + "should function for pod-Service: http"),
    Row("networking.go", G + "should function for pod-Service: udp"),
    Row("networking.go", G + "should function for node-Service: http"),
    Row("networking.go", G + "should function for node-Service: udp"),
    Row("networking.go", G + "should function for endpoint-Service: http"),
    Row("networking.go", G + "should function for endpoint-Service: udp"),
    Row("networking.go", G + "should function for multiple endpoint-Services with same selector"),
    Row("networking.go", G + "should update endpoints: http"),
    Row("networking.go", G + "should update endpoints: udp"),
    Row("networking.go", G + "should update nodePort: http [Slow]"),
    Row("networking.go", G + "should update nodePort: udp [Slow]"),
    Row("networking.go", G + "should support basic nodePort: udp functionality"),
    Row(
        "networking.go",
        G + "should function for client IP based session affinity: http [LinuxOnly]",
    ),
    Row(
        "networking.go", G + "should function for client IP based session affinity: udp [LinuxOnly]"
    ),
    Row("networking.go", G + "should be able to handle large requests: http"),
    Row("networking.go", G + "should be able to handle large requests: udp"),
    Row("networking.go", G + "should function for service endpoints using hostNetwork"),
    Row(
        "networking.go",
        N + "should check kube-proxy urls",
        differs="/proxyMode names ebpflb's mode, not iptables or ipvs",
    ),
    # kube_proxy.go
    Row("kube_proxy.go", K + "should set TCP CLOSE_WAIT timeout [Privileged]"),
    Row(
        "kube_proxy.go",
        K + "should update metric for tracking accepted packets destined for localhost nodeports",
        differs="kubeproxy_iptables_localhost_nodeports_accepted_packets_total is iptables"
        " mode's count of packets its localhost-nodePort rule accepted; ebpflb translates"
        " 127.0.0.1:nodePort at connect() (socket-LB), no packet to count: the port reads"
        " ebpflb_service_socket_translations_total of the 127.0.0.1:nodePort frontend",
    ),
)


def by_name() -> dict[str, Row]:
    return {row.name: row for row in ROWS}
