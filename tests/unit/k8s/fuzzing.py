"""Hypothesis settings and strategies shared by the fuzz tests (tests/unit/k8s/test_fuzz_*.py).

The default run is short (a few seconds of CPU for all of them); `HYPOTHESIS_PROFILE=long`
runs the campaign (each test's `long` count, about 150,000 examples in all), e.g.:

    HYPOTHESIS_PROFILE=long nice .venv/bin/python -m pytest -q tests/unit/k8s/test_fuzz_*.py \
        --hypothesis-show-statistics
"""

from __future__ import annotations

import copy
import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"


def fuzz(examples: int, long: int) -> settings:
    """`examples` in the default run, `long` in the campaign."""
    return settings(
        max_examples=long if LONG else examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None if LONG else settings.default.database,
    )


# ---- JSON-shaped values ----------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"x": value}
    return value


deep = st.integers(min_value=0, max_value=150).map(nested)
weird = json_values | deep  # anything at all, in place of a field's value


def huge(item: st.SearchStrategy[Any], sizes: list[int]) -> st.SearchStrategy[list[Any]]:
    """A list of one repeated item at sizes around an API limit (cheap to build)."""
    return st.builds(lambda value, n: [value] * n, item, st.sampled_from(sizes))


# ---- mutations of a plausible object --------------------------------------------------


def _slots(value: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in `value`, containers before their contents."""
    if isinstance(value, dict):
        for key, item in value.items():
            out.append((value, key))
            _slots(item, out)
    elif isinstance(value, list):
        for index, item in enumerate(value[:50]):  # a huge list: its head is enough
            out.append((value, index))
            _slots(item, out)
    return out


_mutations = st.sampled_from([0, 0, 0, 1, 1, 2, 3])
_actions = st.sampled_from(["replace", "replace", "null", "remove", "add"])
_keys = st.text(max_size=8)


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[Any]) -> Any:
    """`base`'s value with 0-3 mutations at random places: a value replaced by anything
    (a wrong type, deep nesting), made null, removed; or a field nobody reads added."""
    value = copy.deepcopy(draw(base))
    for _ in range(draw(_mutations)):
        slots = _slots(value, [])
        if not slots:
            break
        container, key = slots[draw(st.integers(0, len(slots) - 1))]
        action = draw(_actions)
        if action == "replace":
            container[key] = draw(weird)
        elif action == "null":
            container[key] = None
        elif action == "remove":
            del container[key]
        elif isinstance(container, dict):
            container[draw(_keys)] = draw(json_values)
        else:
            container.append(draw(json_values))
    return value


# ---- field values: mostly valid, now and then at or past an edge --------------------------


def mix(valid: st.SearchStrategy[Any], edge: st.SearchStrategy[Any], percent: int = 6) -> Any:
    """`valid`, except `percent` of the time `edge`: with a dozen fields each at the usual
    uniform odds, nearly no object would come out valid. (Shrinks towards valid.)"""
    return st.integers(min_value=0, max_value=99).flatmap(
        lambda n: edge if n >= 100 - percent else valid
    )


valid_ipv4 = st.sampled_from(
    ["10.96.0.10", "10.96.0.11", "192.0.2.7", "0.0.0.0"]
) | st.ip_addresses(v=4).map(str)
ip_texts = mix(
    valid_ipv4,
    st.sampled_from(
        [
            "fd00::10",
            "::ffff:10.0.0.1",
            "::",
            "fe80::1%eth0",
            "10.96.0.300",
            "010.96.0.1",
            "1.2.3",
            " 10.96.0.10",
            "10.96.0.10\x00",
            "None",
            "",
        ]
    )
    | st.ip_addresses(v=6).map(str)
    | st.text(alphabet="0123456789abcdef.:%", max_size=20),
    percent=15,
)
cidr_texts = mix(
    st.builds(lambda ip, n: f"{ip}/{n}", valid_ipv4, st.integers(min_value=0, max_value=32)),
    st.builds(lambda ip, n: f"{ip}/{n}", ip_texts, st.integers(min_value=-1, max_value=200))
    | st.sampled_from(["10.0.0.0/8", " 10.0.0.0/8 ", "10.0.0.0", "10.0.0.0/255.0.0.0", "/8"])
    | st.builds(lambda ip, n: f"{ip}/{n}", ip_texts, st.sampled_from(["08", "+8", "٣", "1000"])),
    percent=20,
)
port_numbers = mix(
    st.integers(min_value=1, max_value=65535), st.sampled_from([0, 65536, -1, 2**64])
)
target_ports = mix(
    st.integers(min_value=1, max_value=65535) | st.sampled_from(["http", "8080"]),
    st.sampled_from(["", "0", 0, "65535", "65536", "00080", "٣", "²", "9" * 6000])
    | st.integers(min_value=0, max_value=70000).map(str)
    | st.text(max_size=6),
    percent=20,
)
protocols = mix(st.sampled_from(["TCP", "UDP", ""]), st.sampled_from(["SCTP", "tcp", "ICMP"]), 15)
port_names = st.sampled_from(["", "http", "dns", "a"])
booleans = mix(st.booleans() | st.none(), st.sampled_from(["true", "false", "", 0, 1]))
names = mix(st.sampled_from(["web", "dns", "a"]), st.sampled_from([""]) | st.text(max_size=6))
namespaces = st.sampled_from(["default", "kube-system", ""])


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


def obj(
    fields: dict[str, st.SearchStrategy[Any]], *, usual: tuple[str, ...] = ()
) -> st.SearchStrategy[dict[str, Any]]:
    """An object with its `usual` fields, and each other one maybe."""
    return st.fixed_dictionaries(
        {k: v for k, v in fields.items() if k in usual},
        optional={k: v for k, v in fields.items() if k not in usual},
    )


def metadata(label: str, usual: bool) -> st.SearchStrategy[dict[str, Any]]:
    return obj(
        {
            "name": names,
            "namespace": namespaces,
            "labels": obj({label: names, "app": names}, usual=(label,) if usual else ()),
        },
        usual=("name", "labels"),
    )


service_ports = obj(
    {
        "name": port_names,
        "protocol": protocols,
        "port": port_numbers,
        "targetPort": target_ports,
        "nodePort": port_numbers,
    },
    usual=("port",),
)
plausible_services = obj(
    {
        "apiVersion": st.just("v1"),
        "kind": st.just("Service"),
        "metadata": metadata("service.kubernetes.io/service-proxy-name", usual=False),
        "spec": obj(
            {
                "type": mix(
                    st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer", ""]),
                    st.sampled_from(["ExternalName", "Weird", "clusterip"]),
                ),
                "clusterIP": ip_texts,
                "clusterIPs": st.lists(ip_texts, max_size=2),
                "externalIPs": st.lists(ip_texts, max_size=3),
                "loadBalancerSourceRanges": st.lists(cidr_texts, max_size=3),
                "externalTrafficPolicy": mix(
                    st.sampled_from(["Cluster", "Local", ""]), st.just("x")
                ),
                "internalTrafficPolicy": mix(
                    st.sampled_from(["Cluster", "Local", ""]), st.just("x")
                ),
                "healthCheckNodePort": port_numbers,
                "ports": mix(st.lists(service_ports, min_size=1, max_size=4), st.just([])),
            },
            usual=("clusterIP", "ports"),
        ),
        "status": obj(
            {"loadBalancer": obj({"ingress": st.lists(obj({"ip": ip_texts, "hostname": names}))})}
        ),
    },
    usual=("metadata", "spec"),
)
endpoint_objects = obj(
    {
        "addresses": mix(
            st.lists(ip_texts, min_size=1, max_size=2), huge(valid_ipv4, [100, 101]) | st.just([])
        ),
        "conditions": obj({"ready": booleans, "serving": booleans, "terminating": booleans}),
        "nodeName": names,
        "zone": names,
    },
    usual=("addresses",),
)
slice_ports = obj(
    {"name": port_names, "protocol": protocols, "port": optional(port_numbers)}, usual=("port",)
)
plausible_slices = obj(
    {
        "apiVersion": st.just("discovery.k8s.io/v1"),
        "kind": st.just("EndpointSlice"),
        "metadata": metadata("kubernetes.io/service-name", usual=True),
        "addressType": mix(st.just("IPv4"), st.sampled_from(["IPv6", "FQDN", "", "ipv4"]), 15),
        "ports": mix(st.lists(slice_ports, max_size=3), huge(slice_ports, [100, 101])),
        "endpoints": mix(
            st.lists(endpoint_objects, max_size=4), huge(endpoint_objects, [1000, 1001])
        ),
    },
    usual=("metadata", "addressType", "endpoints"),
)
services = mutated(plausible_services)
slices = mutated(plausible_slices)
