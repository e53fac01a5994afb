"""An optional source: the ``/metrics`` of NVIDIA's dcgm-exporter, when it runs on the node.

Each scrape becomes one partial ``GpuReading`` per GPU, and the fault transitions are the same
pure functions the NVML poll uses (``agent.faults``), with ``source="dcgm"``. Two things are
particular to DCGM:

- ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding only the *last* XID a GPU raised. A change of its
  value is a new XID; the first scrape only sets the baseline (that XID may be days old); and a
  repeat of the same XID cannot be seen in it. Where the exporter has the xid-count collector
  (``DCGM_EXP_XID_ERRORS_COUNT{xid=...}``), a growth of a count is a new XID, repeats included.
- dcgm-exporter refreshes its values every few seconds to 30 s, so its XIDs often arrive after
  the kernel log's; the agent folds them with ``XidFolder`` and the controller folds incidents.

Throttling is left to the NVML poll (the exporter's sampled bitmask says nothing of duration).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from agent.faults import FaultTracker
from gpus.backend import GpuReading
from vigil_core.signals import GpuRef, Signal, SignalKind, normalize_pci_bus_id

XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
# dcgm-exporter field -> GpuReading field
_FIELDS = {
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_volatile_uncorrected",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_volatile_corrected",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_aggregate_uncorrected",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_aggregate_corrected",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_pages_dbe",
    "DCGM_FI_DEV_RETIRED_SBE": "retired_pages_sbe",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "remap_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remap_failure",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_corrected",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrected",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "throttle_reasons",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle_reasons",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replays",
}
_BOOLS = {"retired_pages_pending", "remap_pending", "remap_failure"}
NVLINK_TOTAL = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"


_Xids = dict[tuple[GpuRef, int], float]


class DcgmScrapeError(Exception):
    pass


def fetch(url: str, timeout_s: float = 5.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (configured URL)
            return str(response.read().decode("utf-8", errors="replace"))
    except OSError as exc:
        raise DcgmScrapeError(f"cannot scrape dcgm-exporter at {url}: {exc}") from exc


def _gpu(labels: dict[str, str]) -> GpuRef | None:
    try:
        bus = normalize_pci_bus_id(labels["pci_bus_id"]) if labels.get("pci_bus_id") else ""
        return GpuRef(int(labels.get("gpu", "-1")), labels.get("UUID", ""), bus)
    except ValueError:
        return None


def parse_exposition(text: str) -> tuple[dict[GpuRef, GpuReading], dict[tuple[GpuRef, int], float]]:
    """Per-GPU readings, and XID observations: (gpu, xid) -> count, or (gpu, -1) -> last XID."""
    fields: dict[GpuRef, dict[str, Any]] = {}
    xids: dict[tuple[GpuRef, int], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            gpu = _gpu(sample.labels)
            if gpu is None:
                continue
            # The parser adds "_total" to a counter's samples; dcgm-exporter's names do not have it.
            name, value = sample.name, sample.value
            if family.type == "counter":
                name = name.removesuffix("_total")
            if name == XID_GAUGE:
                xids[(gpu, -1)] = value
            elif name == XID_COUNT and sample.labels.get("xid", "").isdigit():
                xids[(gpu, int(sample.labels["xid"]))] = value
            elif name in _FIELDS:
                field = _FIELDS[name]
                fields.setdefault(gpu, {})[field] = bool(value) if field in _BOOLS else int(value)
            elif name == NVLINK_TOTAL:
                fields.setdefault(gpu, {})["nvlink_errors"] = {(-1, "crc_flit"): int(value)}
    return {gpu: GpuReading(gpu=gpu, **values) for gpu, values in fields.items()}, xids


class DcgmCollector:
    def __init__(self, node: str, url: str, clock: Callable[[], float], scrape: Callable[[str], str] = fetch) -> None:
        self._node = node
        self._url = url
        self._clock = clock
        self._scrape = scrape
        self._faults = FaultTracker(node, "dcgm")
        self._xids: dict[tuple[GpuRef, int], float] | None = None

    def collect(self) -> list[Signal]:
        readings, xids = parse_exposition(self._scrape(self._url))
        now = self._clock()
        signals = []
        for reading in readings.values():
            signals += self._faults.observe(reading, now)
        if self._xids is not None:
            signals += self._new_xids(self._xids, xids, now)
        self._xids = xids
        return signals

    def _new_xids(self, before: _Xids, now_xids: _Xids, now: float) -> list[Signal]:
        out = []
        counted = {gpu for gpu, xid in now_xids if xid >= 0}  # counts see repeats: prefer them
        for (gpu, xid), value in now_xids.items():
            old = before.get((gpu, xid))
            if xid == -1 and gpu not in counted and value > 0 and value != old:  # the last-XID gauge changed
                out.append(self._xid(gpu, int(value), 1, now))
            elif xid >= 0 and value > (old or 0):
                out.append(self._xid(gpu, xid, value - (old or 0), now))
        return out

    def _xid(self, gpu: GpuRef, code: int, count: float, now: float) -> Signal:
        message = f"XID {code} (dcgm-exporter{'' if count == 1 else f', {count:g} times'})"
        return Signal(self._node, SignalKind.XID, gpu, code, count, message, "dcgm", now)
