"""The states every server is classified into, in code order (the recording rule's value is
the index), with the colour each is drawn in by dashboards, renders and snapshot charts."""

from __future__ import annotations

STATES = ("unavailable", "idle", "healthy", "prefill_backlog", "decode_contention",
          "kv_capacity", "scheduling_bottleneck")
STATE_COLOURS = {"unavailable": "#7f7f7f", "idle": "#c7c7c7", "healthy": "#2ca02c",
                 "prefill_backlog": "#ff7f0e", "decode_contention": "#d62728",
                 "kv_capacity": "#9467bd", "scheduling_bottleneck": "#e6b800"}
