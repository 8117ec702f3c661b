"""Which of the alerts that fired in Prometheus reached a receiver, for `sglang-obs snapshot`.

Prometheus's ALERTS series says when an alert fired, not whether anyone was told. Between the
two stand Alertmanager's routing (which receiver, if any: `blackhole` has none), its inhibition
rules and its group_wait: a new group is held that long before the first notification, and an
alert that resolves within it is never sent. So an alert that fired for 15 s under a 30 s
group_wait reached Alertmanager and stopped there: it only flickered.

What each verdict rests on, best first (`source` in summary.json):
- `alert-sink log`: the bundled sink's alerts.jsonl (`--alerts-log`) records every notification
  a receiver got: an episode is `notified` when a firing notification for it is there, whatever
  else the log holds, and `not_notified` when the log covers its time and none is;
- `timing`: otherwise, each firing episode (from the ALERTS series, at the snapshot's step) is
  set against the route's group_wait and the inhibition rules of the Alertmanager configuration
  (the running one's, with `--alertmanager`; else alertmanager/alertmanager.yml): an episode at
  least group_wait long that no firing source alert inhibits is taken as notified.
`--alertmanager` also adds what Alertmanager holds now for the alert (`active`, `suppressed`
with the silence or inhibiting alert, and its receivers).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sglang_obs.core.safe_files import Refused, read_input
from sglang_obs.core.settings import Settings, default

VERDICTS = ("notified", "not_notified", "flickered", "inhibited", "not_routed", "silenced")
_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*$')
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


class DeliveryError(RuntimeError):
    """The Alertmanager or the alert log given cannot be read; the message names it."""


def seconds(text: str | None, default: float) -> float:
    if not text:
        return default
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = _DURATION.findall(str(text))
    return sum(float(v) * units[u] for v, u in parts) if parts else default


def matcher(text: str):
    """Alertmanager's matcher syntax ('severity="critical"', 'alertname=~"A|B"') as a predicate
    over a label dict."""
    m = _MATCHER.match(text)
    if not m:
        raise ValueError(f"cannot read matcher {text!r}")
    name, op, value = m.groups()
    value = value.replace('\\"', '"')
    if op in ("=~", "!~"):
        pattern = re.compile(f"^(?:{value})$")
        return lambda labels: bool(pattern.match(labels.get(name, ""))) == (op == "=~")
    return lambda labels: (labels.get(name, "") == value) == (op == "=")


def _matchers(node: dict) -> list:
    texts = list(node.get("matchers") or [])
    texts += [f'{k}="{v}"' for k, v in (node.get("match") or {}).items()]
    texts += [f'{k}=~"{v}"' for k, v in (node.get("match_re") or {}).items()]
    return [matcher(t) for t in texts]


@dataclass
class Route:
    receiver: str
    group_wait: float
    group_interval: float
    has_configs: bool  # the receiver sends somewhere (blackhole has no configs)


@dataclass
class Inhibition:
    source: list
    target: list
    equal: list[str]


@dataclass
class AlertmanagerConfig:
    tree: dict
    receivers: dict[str, bool]  # name -> has any *_configs
    inhibitions: list[Inhibition] = field(default_factory=list)
    origin: str = ""

    @classmethod
    def parse(cls, text: str, origin: str) -> AlertmanagerConfig:
        doc = yaml.safe_load(text) or {}
        receivers = {r["name"]: any(k.endswith("_configs") and v for k, v in r.items())
                     for r in doc.get("receivers") or []}
        inhibitions = [Inhibition(
            _matchers({"matchers": r.get("source_matchers"), "match": r.get("source_match"),
                       "match_re": r.get("source_match_re")}),
            _matchers({"matchers": r.get("target_matchers"), "match": r.get("target_match"),
                       "match_re": r.get("target_match_re")}),
            list(r.get("equal") or [])) for r in doc.get("inhibit_rules") or []]
        return cls(doc.get("route") or {}, receivers, inhibitions, origin)

    @classmethod
    def shipped(cls, s: Settings | None = None) -> AlertmanagerConfig:
        """The configuration folder's alertmanager.yml."""
        path = (s or default()).alertmanager_file
        return cls.parse(path.read_text(), "alertmanager/alertmanager.yml")

    def route(self, labels: dict[str, str]) -> Route:
        """The route Alertmanager picks for `labels`: the first matching child, depth first
        (this stack's routes do not `continue`), inheriting its parent's timings."""
        node, inherited = self.tree, {}
        while True:
            inherited = {**inherited, **{k: node[k] for k in
                                         ("receiver", "group_wait", "group_interval")
                                         if k in node}}
            child = next((c for c in node.get("routes") or []
                          if all(m(labels) for m in _matchers(c))), None)
            if child is None:
                break
            node = child
        receiver = inherited.get("receiver", "")
        return Route(receiver, seconds(inherited.get("group_wait"), 30.0),
                     seconds(inherited.get("group_interval"), 300.0),
                     self.receivers.get(receiver, False))

    def inhibitor(self, target: dict[str, str], at: float, firing: list[dict]) -> str | None:
        """The alertname of a firing alert that inhibits `target` at time `at`, if any."""
        for rule in self.inhibitions:
            if not all(m(target) for m in rule.target):
                continue
            for other in firing:
                labels = other["all_labels"]
                if labels is target or not all(m(labels) for m in rule.source):
                    continue
                if any(labels.get(k, "") != target.get(k, "") for k in rule.equal):
                    continue
                if any(e["start"] <= at < e["end"] for e in other["_episodes"]):
                    return labels.get("alertname", "")
        return None


# -- the sources ---------------------------------------------------------------------------------
def read_alerts_log(path: Path) -> list[dict]:
    """The alert sink's JSON lines (and its rotated FILE.1, FILE.2, ... beside it). Never
    blocks (sglang_obs.core.safe_files): the file named may be a regular file or a pipe
    something writes to, the rotated ones beside it regular files; a FIFO nothing writes to, a
    device or a directory is a DeliveryError naming it."""
    entries = []
    files = sorted(path.parent.glob(path.name + ".*"), reverse=True) + [path]
    for f in files:
        try:
            lines = read_input(f, allow_pipe=f == path).decode(errors="replace").splitlines()
        except Refused as err:
            raise DeliveryError(f"--alerts-log {f}: cannot read it ({err})") from None
        except OSError as err:
            raise DeliveryError(f"--alerts-log {f}: cannot read it ({err.strerror})") from None
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("labels"), dict):
                entries.append(entry)
    return entries


def _get(url: str, what: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as err:
        raise DeliveryError(f"--alertmanager: {what} answered {err.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise DeliveryError(f"--alertmanager: Alertmanager at {what} is unreachable: "
                            f"{getattr(err, 'reason', err)}") from None


def alertmanager_state(url: str) -> tuple[AlertmanagerConfig, list[dict]]:
    """The running Alertmanager's configuration and the alerts it holds now."""
    from sglang_obs.core import shown  # every URL shown goes through shown.url

    url = url.rstrip("/")
    at = shown.url(url)
    status = _get(f"{url}/api/v2/status", at)
    original = ((status or {}).get("config") or {}).get("original", "")
    config = (AlertmanagerConfig.parse(original, f"the Alertmanager at {at}") if original
              else AlertmanagerConfig.shipped())
    alerts = _get(f"{url}/api/v2/alerts", at)
    return config, alerts if isinstance(alerts, list) else []


# -- the verdicts --------------------------------------------------------------------------------
def _same_alert(alert_labels: dict[str, str], other: dict) -> bool:
    return all(other.get(k) == v for k, v in alert_labels.items()
               if k not in ("alertstate", "__name__"))


def judge(alerts: list[dict], config: AlertmanagerConfig, window_start: float,
          window_end: float, log: list[dict] | None = None,
          held: list[dict] | None = None) -> None:
    """Add `delivery` to each of `alerts` (the snapshot's: all_labels, _episodes)."""
    log_span = ((min(e.get("time", 0) for e in log), max(e.get("time", 0) for e in log))
                if log else None)
    for alert in alerts:
        labels = alert["all_labels"]
        route = config.route(labels)
        episodes = alert["_episodes"]
        delivery: dict = {"receiver": route.receiver, "group_wait_seconds": route.group_wait,
                          "config": config.origin}
        now_in_am = next((a for a in held or [] if _same_alert(labels, a.get("labels") or {})),
                         None)
        if now_in_am is not None:
            status = now_in_am.get("status") or {}
            delivery["alertmanager"] = {
                "state": status.get("state", ""),
                "inhibited_by": status.get("inhibitedBy") or [],
                "silenced_by": status.get("silencedBy") or [],
                "receivers": [r.get("name", "") for r in now_in_am.get("receivers") or []]}
        notes = []
        for e in episodes:
            e["seconds"] = e["end"] - e["start"]
            if not route.has_configs:
                e["verdict"] = "not_routed"
            elif e["start"] <= window_start and e["seconds"] < route.group_wait:
                e["verdict"] = "notified"  # began before the window: its wait may be over
                notes.append("began before the window")
            elif e["seconds"] < route.group_wait:
                e["verdict"] = "flickered"
            elif (by := config.inhibitor(labels, e["start"] + route.group_wait, alerts)):
                e["verdict"] = "inhibited"
                e["inhibited_by"] = by
            else:
                e["verdict"] = "notified"
        by_timing = next((v for v in ("notified", "inhibited", "flickered", "not_routed")
                          if any(e["verdict"] == v for e in episodes)), "flickered")
        delivery["verdict"], delivery["source"] = by_timing, "timing"
        if log and route.has_configs:
            _from_log(delivery, episodes, labels, route, log, log_span)
        if now_in_am is not None and delivery["alertmanager"]["silenced_by"]:
            delivery["verdict"] = "silenced"
        if notes:
            delivery["note"] = "; ".join(sorted(set(notes)))
        alert["delivery"] = delivery


def _from_log(delivery: dict, episodes: list[dict], labels: dict[str, str], route: Route,
              log: list[dict], log_span: tuple[float, float]) -> None:
    """The sink's log decides each episode it has a firing notification for (notified), and
    each it covers without one (not notified, where timing said notified); the others keep
    their timing verdict. The alert's source is the log when it decided any episode."""
    key = {k: v for k, v in labels.items() if k in ("alertname", "instance", "severity")}
    sent = sorted((e for e in log if e.get("status") == "firing"
                   and _same_alert(key, e["labels"])), key=lambda e: e.get("time", 0))
    first, decided = None, False
    for e in episodes:
        got = [s for s in sent if e["start"] - 60 <= s.get("time", 0)
               <= e["end"] + route.group_interval + 60]
        if got:
            e["verdict"], decided = "notified", True
            first = first or got[0]
        elif log_span[0] <= e["start"] + route.group_wait and e["end"] <= log_span[1] + 1:
            e["verdict"] = "not_notified" if e["verdict"] == "notified" else e["verdict"]
            decided = True
    if first is not None:
        delivery.update(verdict="notified", source="alert-sink log",
                        receiver=first.get("receiver", route.receiver),
                        first_notified_at=first.get("time"))
    elif decided and not any(e["verdict"] == "notified" for e in episodes):
        delivery["source"] = "alert-sink log"
        delivery["verdict"] = next(v for v in ("not_notified", "inhibited", "flickered")
                                   if any(e["verdict"] == v for e in episodes))


def describe(alert: dict) -> str:
    """One phrase: what became of `alert` on its way to a receiver."""
    d = alert["delivery"]
    gw = f"{d['group_wait_seconds']:g} s"
    longest = max(e["seconds"] for e in alert["_episodes"])
    source = {"alert-sink log": "the alert sink's log",
              "timing": f"timing against {d['config']}"}[d["source"]]
    verdict = d["verdict"]
    if verdict == "notified":
        when = ""
        if d.get("first_notified_at"):
            from datetime import datetime, timezone

            when = " at " + datetime.fromtimestamp(
                d["first_notified_at"], tz=timezone.utc).strftime("%H:%M:%S")
        text = f"reached the {d['receiver']} receiver{when} (by {source})"
    elif verdict == "not_notified":
        text = (f"reached Alertmanager but no notification for it is in {source}: "
                "no receiver was told")
    elif verdict == "flickered":
        text = (f"only flickered: it fired for {longest:.0f} s at most, under the group_wait of "
                f"{gw}, so Alertmanager notified no receiver (by {source})")
    elif verdict == "inhibited":
        by = next(e["inhibited_by"] for e in alert["_episodes"] if e.get("inhibited_by"))
        text = f"reached Alertmanager, inhibited by {by}: no receiver was told (by {source})"
    elif verdict == "silenced":
        text = "reached Alertmanager, silenced: no receiver was told"
    else:
        text = f"routed to {d['receiver'] or 'no receiver'}, which sends nowhere, by design"
    am = d.get("alertmanager")
    if am:
        text += f"; Alertmanager holds it now ({am['state'] or 'unknown'}"
        text += f", receivers {', '.join(am['receivers'])})" if am["receivers"] else ")"
    return text
