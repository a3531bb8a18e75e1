from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from ebpflb.observe.metrics import DatapathCollector, Metrics, SourceCollector


def test_collectors_read_at_scrape_time() -> None:
    registry = CollectorRegistry()
    datapath = {"connect_xlated": 3, "snat_exhausted": 0}
    source = {"Service": {"lists": 1, "relists": 0}}
    registry.register(DatapathCollector(lambda: datapath))
    registry.register(SourceCollector(lambda: source))
    datapath["connect_xlated"] = 7
    source["Service"]["relists"] = 2
    sample = registry.get_sample_value
    assert sample("ebpflb_datapath_events_total", {"event": "connect_xlated"}) == 7
    assert sample("ebpflb_source_events_total", {"source": "Service", "event": "relists"}) == 2


def test_a_failing_datapath_read_does_not_break_the_scrape() -> None:
    registry = CollectorRegistry()
    Metrics(registry)

    def broken() -> dict[str, int]:
        raise OSError("map gone")

    registry.register(DatapathCollector(broken))
    assert b"ebpflb_sync_duration_seconds" in generate_latest(registry)
