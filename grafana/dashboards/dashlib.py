"""Shared building blocks of the sglang-obs Grafana dashboards (grafanalib 0.7.1).

House style (grafanalib README, "factor out what works"): the datasource and template variables,
the selectors, a few panel functions and the layout helper live here; each `<name>.dashboard.py`
defines a module-level `dashboard` with one call per panel. `python -m sglang_obs.generate
dashboards` loads this module with the stack's settings (`settings`, set before it runs: it reads
no file itself) and renders every definition to `<name>.json` through `render()`, the one function
that touches grafanalib's private `_gen`.

Conventions every panel follows (and tests/test_dashboards.py checks on the generated JSON):
- the first variable is `datasource`; every panel and target uses `${datasource}`, no uid is
  hard-coded (a provisioned uid in a dashboard gives "No data" elsewhere);
- every panel has a title, a one-line description and a unit; every target has a legendFormat,
  intervalFactor 1, and uses `$__rate_interval` in rate/increase (`$__range` for range summaries);
- divisions are guarded as `num / (den > 0)`, so an idle period shows no value instead of NaN;
- SLO and classification thresholds come from prometheus/thresholds.yml, state names and codes
  from sglang_obs.core.states.STATES: one source for rules, alerts and dashboards;
- SGLang's series are written with the `sglang:` spelling (prometheus.yml renames `sglang_` back),
  aggregated across ranks as sum over dp_rank of max over the TP/PP copies (sglang.md §3).
"""

from __future__ import annotations

import io
import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attr
from grafanalib.core import (
    Dashboard,
    DashboardLink,
    GridPos,
    Panel,
    RowPanel,
    Stat,
    StateTimeline,
    StatValueMappingItem,
    StatValueMappings,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

from sglang_obs.core import quantities
from sglang_obs.core.sglang import SERVING_ENDPOINTS
from sglang_obs.core.states import PD_STATE_COLOURS, PD_STATES, STATE_COLOURS, STATES

HERE = Path(__file__).resolve().parent

# The stack's Settings (sglang_obs.core.settings), given by the generator that loads this module
# (sglang_obs.generate.products.dashlib) before it runs.
settings: Any
THRESHOLDS: dict[str, Any] = dict(settings.thresholds)  # noqa: F821 (set by the loader)
SLO = THRESHOLDS["slo"]
CLASSIFY = THRESHOLDS["classification"]
ALERTS = THRESHOLDS["alerts"]
FEATURES = THRESHOLDS["features"]
EXPORTER_JOB = THRESHOLDS["selectors"]["exporter_job"]
SGLANG_JOB = THRESHOLDS["selectors"]["sglang_job"]
SHIPPER_JOB = THRESHOLDS["selectors"]["shipper_job"]
GATEWAY_JOB = THRESHOLDS["selectors"]["gateway_job"]
# A prefill/decode deployment's states (docs/pd.md), read by its dashboards' lines.
PD = THRESHOLDS["pd"]

SCHEMA_VERSION = 39  # Grafana 10.4+; 11 and 12 import it without a migration step
TAG = "sglang"
DS = {"type": "prometheus", "uid": "${datasource}"}

# -- selectors --------------------------------------------------------------------------------
# Where the series come from: `cluster` and `host`, set by a fleet's shippers (docs/fleet.md).
# On one host there is no cluster, and "All" (.*) matches the empty label as well.
WHERE = 'cluster=~"$cluster", host=~"$host"'
# SGLang's own series (job "sglang"): tokenizer and scheduler series carry model_name.
SG = f'{WHERE}, job=~"$job", instance=~"$instance", model_name=~"$model_name"'
# SGLang series without model_name (HTTP middleware).
SG_HTTP = f'{WHERE}, job=~"$job", instance=~"$instance"'
# The exporter's per-server series: `server` is copied into `instance` by prometheus.yml.
EX = f'{WHERE}, job="{EXPORTER_JOB}", instance=~"$instance"'
EXM = f'{EX}, model_name=~"$model_name"'
# Recording rules aggregate to (cluster, host, instance) or (..., model_name) and carry no job.
INST = f'{WHERE}, instance=~"$instance"'
IM = f'{WHERE}, instance=~"$instance", model_name=~"$model_name"'
# GPU series carry no `server`: their instance is the exporter's own address.
GPU_ALL = f'{WHERE}, job="{EXPORTER_JOB}"'
GPU = f'{WHERE}, job="{EXPORTER_JOB}", instance=~"$exporter", gpu=~"$gpu"'
EXPORTER_SELF = f'{WHERE}, job="{EXPORTER_JOB}", instance=~"$exporter"'
# A prefill/decode deployment (docs/pd.md): one per cluster, behind one gateway. Its recorded
# series carry `cluster` (and `pool`, or `instance` and `role`), no host, job or model.
DEPLOYMENT = 'cluster=~"$cluster"'
# The gateway's own series (smg_*, scraped as its own job).
GATEWAY = f'{DEPLOYMENT}, job="{GATEWAY_JOB}"'

# -- units (formatunits names where grafanalib has them; CELSUIS is misspelt there) -----------
SECONDS = "s"
RATIO = "percentunit"
BYTES = "bytes"
WATTS = "watt"
HERTZ = "hertz"
CELSIUS = "celsius"
REQ_PER_S = "reqps"
OPS = "ops"
COUNT = "short"
NONE = "none"
TOKENS = "count:tok"
TOKENS_PER_S = "count:tok/s"
DATE = "dateTimeAsIso"
BYTES_PER_S = "Bps"

# -- state classification ----------------------------------------------------------------------
# The states' own colours (sglang_obs.core.states), so that Grafana, render-dashboard and snapshot
# charts draw each state alike.
STATE_COLORS = dict(STATE_COLOURS)
assert set(STATE_COLORS) == set(STATES), "a state without a colour (or a stale one)"


def value_mappings(values: Iterable[tuple[Any, str, str]]) -> list:
    """Value mappings: (value, text, colour) triples."""
    return [StatValueMappings(*(StatValueMappingItem(text, str(value), color, index)
                                for index, (value, text, color) in enumerate(values)))]


def state_mappings() -> list:
    return value_mappings((code, name, STATE_COLORS[name]) for code, name in enumerate(STATES))


# A PD deployment's and its pools' states (sglang_obs.core.states.PD_STATES, code = index).
PD_STATE_COLORS = dict(PD_STATE_COLOURS)
assert set(PD_STATE_COLORS) == set(PD_STATES), "a PD state without a colour (or a stale one)"


def pd_state_mappings() -> list:
    return value_mappings((code, name, PD_STATE_COLORS[name])
                          for code, name in enumerate(PD_STATES))


def no_traffic(text: str = "No traffic") -> dict:
    return {"type": "special", "options": {"match": "null+nan", "result": {"text": text}}}


UP_DOWN = value_mappings(((0, "down", "red"), (1, "up", "green")))
YES_NO = value_mappings(((0, "no", "green"), (1, "yes", "red")))
# The gateway's smg_worker_health and smg_worker_cb_state (docs/pd.md); -1 while a removed
# worker's series lingers.
HEALTHY_UNHEALTHY = value_mappings(((0, "unhealthy", "red"), (1, "healthy", "green")))
BREAKER_STATES = value_mappings(((-1, "removed", STATE_COLORS["unavailable"]),
                                 (0, "closed", "green"), (1, "open", "red"),
                                 (2, "half_open", "orange")))


# -- thresholds --------------------------------------------------------------------------------
def steps(base: str, *pairs: tuple[float, str]) -> list[dict]:
    """Threshold steps: a base colour, then (value, colour) in increasing order."""
    values = [value for value, _ in pairs]
    assert values == sorted(values), f"threshold steps out of order: {values}"
    return [{"color": base, "value": None}] + [{"color": c, "value": v} for v, c in pairs]


def slo_le(name: str) -> str:
    """The SLO threshold exactly as SGLang renders the bucket bound (e.g. "2.0", "0.1")."""
    return str(SLO[name]["threshold_seconds"])


def slo_seconds(name: str) -> float:
    return float(SLO[name]["threshold_seconds"])


def attainment_steps(name: str) -> list[dict]:
    """SLO attainment: red below 1 - 10x the error budget, orange below the objective."""
    objective = float(SLO[name]["objective"])
    return steps("red", (round(1 - 10 * (1 - objective), 6), "orange"), (objective, "green"))


def error_ratio_steps(name: str) -> list[dict]:
    """SLO error ratio: red above the error budget (1 - objective)."""
    return steps("green", (round(1 - float(SLO[name]["objective"]), 6), "red"))


# -- targets -----------------------------------------------------------------------------------
@attr.s
class PromTarget(Target):
    """A Prometheus query as Grafana 11 stores it: the legacy graphite keys dropped."""

    def to_json_data(self) -> dict:
        data = super().to_json_data()
        for legacy in ("target", "metric", "step", "query"):
            data.pop(legacy)
        data["range"] = not self.instant
        data["editorMode"] = "code"
        return data


def _targets(queries: Sequence[tuple[str, str]], instant: bool = False,
             fmt: str = "time_series") -> list[PromTarget]:
    assert queries, "a panel without a query"
    return [PromTarget(expr=expr.strip(), legendFormat=legend, refId=string.ascii_uppercase[i],
                       datasource=DS, intervalFactor=1, instant=instant, format=fmt)
            for i, (expr, legend) in enumerate(queries)]


# -- panels ------------------------------------------------------------------------------------
def _pos(w: int, h: int) -> GridPos:
    return GridPos(x=0, y=0, w=w, h=h)


def _defaults(unit: str, thresholds: list[dict] | None = None, min_: float | None = None,
              max_: float | None = None, decimals: int | None = None,
              mappings: list | None = None) -> dict:
    defaults: dict[str, Any] = {"unit": unit}
    if thresholds is not None:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if decimals is not None:
        defaults["decimals"] = decimals
    if mappings:
        defaults["mappings"] = [m.to_json_data() if hasattr(m, "to_json_data") else m
                                for m in mappings]
    return defaults


def dashed(*ref_ids: str, unstack: bool = False) -> list[dict]:
    """Overrides drawing these queries as dashed reference lines (limits, baselines), kept out
    of the stack with `unstack`."""
    props: list[dict] = [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]
    if unstack:
        props.append({"id": "custom.stacking", "value": {"group": "A", "mode": "none"}})
    return [{"matcher": {"id": "byFrameRefID", "options": ref}, "properties": props}
            for ref in ref_ids]


def timeseries(title: str, description: str, queries: Sequence[tuple[str, str]], unit: str,
               w: int = 8, h: int = 8, thresholds: list[dict] | None = None,
               min_: float | None = None, max_: float | None = None, stack: bool = False,
               bars: bool = False, overrides: list[dict] | None = None,
               mappings: list | None = None, no_value: str | None = None) -> TimeSeries:
    defaults = _defaults(unit, thresholds, min_, max_, mappings=mappings)
    if no_value:  # what an empty panel says instead of "No data"
        defaults["noValue"] = no_value
    return TimeSeries(
        title=title, description=description, dataSource=DS, targets=_targets(queries),
        unit=unit, gridPos=_pos(w, h), maxDataPoints=None,
        drawStyle="bars" if bars else "line", fillOpacity=60 if bars else (30 if stack else 10),
        stacking={"group": "A", "mode": "normal"} if stack else {"group": "A", "mode": "none"},
        thresholds=thresholds or steps("green"),
        thresholdsStyleMode="dashed" if thresholds else "off",
        overrides=overrides or [], tooltipMode="multi", tooltipSort="desc",
        extraJson={"fieldConfig": {"defaults": defaults}},
    )


def stat(title: str, description: str, queries: Sequence[tuple[str, str]], unit: str,
         w: int = 4, h: int = 4, thresholds: list[dict] | None = None,
         mappings: list | None = None, instant: bool = False, graph: bool = True,
         background: bool = False, decimals: int | None = None, no_value: str = "No data",
         text_mode: str = "auto", min_: float | None = None,
         max_: float | None = None) -> Stat:
    return Stat(
        title=title, description=description, dataSource=DS,
        targets=_targets(queries, instant=instant), format=unit, gridPos=_pos(w, h),
        thresholds=thresholds or steps("green"), mappings=mappings or [],
        graphMode="area" if graph and not instant else "none",
        colorMode="background" if background else "value", reduceCalc="lastNotNull",
        noValue=no_value, decimals=decimals, textMode=text_mode, color={"mode": "thresholds"},
        maxDataPoints=None,
        extraJson={"fieldConfig": {"defaults": _defaults(unit, thresholds, min_, max_, decimals,
                                                         mappings)}},
    )


def state_timeline(title: str, description: str, queries: Sequence[tuple[str, str]],
                   mappings: list, unit: str = NONE, w: int = 24, h: int = 6,
                   overrides: list[dict] | None = None, show_value: str = "auto",
                   color_mode: str = "thresholds") -> StateTimeline:
    return StateTimeline(
        title=title, description=description, dataSource=DS, targets=_targets(queries),
        gridPos=_pos(w, h), mappings=mappings, overrides=overrides or [], maxDataPoints=None,
        showValue=show_value, mergeValues=True, fillOpacity=80, rowHeight=0.9,
        colorMode=color_mode, thresholds=steps("green"),
        extraJson={"fieldConfig": {"defaults": {"unit": unit}}},
    )


@attr.s
class BarGaugePanel(Panel):
    """A Grafana 7+ bar gauge (grafanalib's BarGauge writes the Grafana 6 `fieldOptions`)."""

    unit = attr.ib(default=NONE)
    min = attr.ib(default=None)
    max = attr.ib(default=None)
    overrides = attr.ib(factory=list)

    def to_json_data(self) -> dict:
        return self.panel_json({
            "type": "bargauge",
            "fieldConfig": {"defaults": {**_defaults(self.unit, min_=self.min, max_=self.max),
                                         "color": {"mode": "thresholds"}},
                            "overrides": self.overrides},
            "options": {"displayMode": "gradient", "orientation": "horizontal",
                        "namePlacement": "auto", "showUnfilled": True, "valueMode": "color",
                        "sizing": "auto", "minVizWidth": 8, "minVizHeight": 16,
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                          "values": False}},
        })


def bar_gauge(title: str, description: str, queries: Sequence[tuple[str, str]], unit: str,
              w: int = 8, h: int = 6, min_: float | None = None, max_: float | None = None,
              thresholds: list[dict] | None = None, overrides: list[dict] | None = None,
              instant: bool = True) -> BarGaugePanel:
    return BarGaugePanel(
        title=title, description=description, dataSource=DS,
        targets=_targets(queries, instant=instant), gridPos=_pos(w, h), unit=unit,
        min=min_, max=max_, thresholds=thresholds or steps("green"), overrides=overrides or [],
    )


@attr.s
class HeatmapPanel(Panel):
    """The Grafana 9+ heatmap over pre-bucketed Prometheus histograms (no Angular options:
    grafanalib's Heatmap writes the legacy panel, which Grafana would migrate on load)."""

    unit = attr.ib(default=SECONDS)
    cell_unit = attr.ib(default=REQ_PER_S)

    def to_json_data(self) -> dict:
        return self.panel_json({
            "type": "heatmap",
            "fieldConfig": {"defaults": {"unit": self.unit, "custom": {
                "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                "scaleDistribution": {"type": "linear"}}}, "overrides": []},
            "options": {
                "calculate": False,
                "cellGap": 1,
                "cellValues": {"unit": self.cell_unit},
                "color": {"mode": "scheme", "scheme": "Oranges", "fill": "dark-orange",
                          "scale": "exponential", "exponent": 0.5, "steps": 64,
                          "reverse": False},
                "exemplars": {"color": "rgba(255,0,255,0.7)"},
                "filterValues": {"le": 1e-9},
                "legend": {"show": True},
                "rowsFrame": {"layout": "auto"},
                "showValue": "never",
                "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False},
                "yAxis": {"axisPlacement": "left", "reverse": False, "unit": self.unit},
            },
        })


def heatmap(title: str, description: str, expr: str, unit: str = SECONDS,
            cell_unit: str = REQ_PER_S, w: int = 8, h: int = 8) -> HeatmapPanel:
    """`expr` must be `sum by (le) (rate(X_bucket{...}[$__rate_interval]))`."""
    return HeatmapPanel(
        title=title, description=description, dataSource=DS,
        targets=_targets([(expr, "{{le}}")], fmt="heatmap"), gridPos=_pos(w, h),
        unit=unit, cell_unit=cell_unit, maxDataPoints=None,
    )


def table(title: str, description: str, queries: Sequence[tuple[str, str]], unit: str = NONE,
          w: int = 24, h: int = 6, rename: dict[str, str] | None = None,
          hide: Sequence[str] = ("Time",), merge: bool = False) -> Table:
    """An instant table; label columns plus one value column per query (`Value #<refId>`)."""
    transformations: list[dict] = []
    if merge:
        transformations.append({"id": "merge", "options": {}})
    transformations.append({"id": "organize", "options": {
        "excludeByName": {name: True for name in hide}, "indexByName": {},
        "renameByName": rename or {}}})
    return Table(
        title=title, description=description, dataSource=DS,
        targets=_targets(queries, instant=True, fmt="table"), gridPos=_pos(w, h), unit=unit,
        transformations=transformations, filterable=True,
        extraJson={"fieldConfig": {"defaults": {"unit": unit}}},
    )


@attr.s
class AlertListPanel(Panel):
    """Grafana's unified alert list (9+): Prometheus rules show up through the data source
    (provisioned with manageAlerts), Alertmanager silences through the Alertmanager one."""

    unit = attr.ib(default=NONE)

    def to_json_data(self) -> dict:
        return self.panel_json({
            "type": "alertlist",
            "fieldConfig": {"defaults": {"unit": self.unit}, "overrides": []},
            "options": {"viewMode": "list", "groupMode": "default", "groupBy": [],
                        "maxItems": 50, "sortOrder": 1, "dashboardAlerts": False,
                        "alertName": "", "alertInstanceLabelFilter": "",
                        "stateFilter": {"firing": True, "pending": True, "noData": False,
                                        "normal": False, "error": True}},
        })


def alert_list(title: str, description: str, w: int = 24, h: int = 8) -> AlertListPanel:
    return AlertListPanel(title=title, description=description, dataSource=DS,
                          gridPos=_pos(w, h))


def row(title: str, description: str) -> RowPanel:
    return RowPanel(title=title, description=description, dataSource=DS,
                    gridPos=_pos(24, 1))


# -- layout ------------------------------------------------------------------------------------
@attr.s(frozen=True)
class Feature:
    """A section for the series of an SGLang feature a server may not turn on: its row is
    collapsed, so a dashboard of servers without the feature shows a title bar, not empty
    panels (Grafana has no row that hides itself when its queries are empty)."""

    title: str = attr.ib()
    description: str = attr.ib()
    panels: Sequence[Panel] = attr.ib()


def layout(*sections: tuple[str, str, Sequence[Panel]] | Feature) -> list[Panel]:
    """Rows of panels: each section is (row title, row description, panels), placed left to
    right and wrapped at 24 columns, or a Feature (a collapsed row holding its panels).
    Returns the positioned panel list."""
    out: list[Panel] = []
    y = 0
    for section in sections:
        feature = isinstance(section, Feature)
        title, description, panels = ((section.title, section.description, section.panels)
                                      if feature else section)
        head = attr.evolve(row(title, description), gridPos=GridPos(x=0, y=y, w=24, h=1))
        y += 1
        x, line_height, placed = 0, 0, []
        for panel in panels:
            w, h = panel.gridPos.w, panel.gridPos.h
            if x + w > 24:
                x, y, line_height = 0, y + line_height, 0
            placed.append(attr.evolve(panel, gridPos=GridPos(x=x, y=y, w=w, h=h)))
            x += w
            line_height = max(line_height, h)
        if feature:  # the panels live in the row; the next row follows its title bar
            out.append(attr.evolve(head, collapsed=True, panels=placed))
            y = head.gridPos.y + 1
        else:
            out += [head, *placed]
            y += line_height
    return out


# -- variables ---------------------------------------------------------------------------------
@attr.s
class Variable(Template):
    """A query variable that starts on "All" and records its query as Grafana does."""

    def to_json_data(self) -> dict:
        data = super().to_json_data()
        data["definition"] = self.query
        if self.includeAll:
            data["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
        return data


def query_variable(name: str, label: str, query: str) -> Variable:
    return Variable(name=name, label=label, query=query, dataSource=DS, includeAll=True,
                    multi=True, allValue=".*", refresh=2, sort=1, regex="")


DATASOURCE = Template(name="datasource", label="Data source", type="datasource",
                      query="prometheus", default="default", regex="", refresh=1)
CLUSTER = query_variable(
    "cluster", "Cluster", f'label_values(up{{job=~"{SGLANG_JOB}|{EXPORTER_JOB}"}}, cluster)')
HOST = query_variable(
    "host", "Host",
    f'label_values(up{{job=~"{SGLANG_JOB}|{EXPORTER_JOB}", cluster=~"$cluster"}}, host)')
JOB = query_variable("job", "SGLang job",
                     f"label_values(sglang:num_requests_total{{{WHERE}}}, job)")
INSTANCE = query_variable(
    "instance", "Server", f'label_values(sglang_obs_up{{{WHERE}, job="{EXPORTER_JOB}"}}, instance)')
MODEL = query_variable(
    "model_name", "Model",
    f'label_values(sglang:num_requests_total{{{WHERE}, job=~"$job", instance=~"$instance"}}, '
    'model_name)')
EXPORTER = query_variable(
    "exporter", "Exporter",
    f'label_values(sglang_obs_exporter_build_info{{{WHERE}, job="{EXPORTER_JOB}"}}, instance)')
GPU_VAR = query_variable(
    "gpu", "GPU",
    f'label_values(sglang_obs_gpu_info{{{WHERE}, job="{EXPORTER_JOB}", instance=~"$exporter"}}, '
    'gpu)')
# A PD deployment's dashboards select only the cluster: the gateway's job counts as well.
DEPLOYMENT_CLUSTER = query_variable(
    "cluster", "Cluster",
    f'label_values(up{{job=~"{SGLANG_JOB}|{EXPORTER_JOB}|{GATEWAY_JOB}"}}, cluster)')

LINKS = [DashboardLink(title="SGLang dashboards", type="dashboards", tags=[TAG], asDropdown=True,
                       keepTime=True, includeVars=True, targetBlank=False)]


def data_links(uid: str, title: str, labels: Sequence[str] = ("cluster",)) -> list[dict]:
    """A data link to dashboard `uid` with the clicked series' `labels` as its variables, on
    the same time range."""
    variables = "".join(f"var-{label}=${{__field.labels.{label}}}&" for label in labels)
    return [{"title": title, "url": f"/d/{uid}?{variables}${{__url_time_range}}"}]


def linked(panel: Panel, links: list[dict]) -> Panel:
    """`panel` with data links on every series (timeseries, stat, state timeline)."""
    panel.extraJson["fieldConfig"]["defaults"]["links"] = links
    return panel


# -- dashboard ---------------------------------------------------------------------------------
@attr.s
class ModernDashboard(Dashboard):
    """grafanalib's Dashboard without the pre-Grafana-5 keys (rows, style, ...)."""

    def to_json_data(self) -> dict:
        data = super().to_json_data()
        for legacy in ("rows", "style", "sharedCrosshair", "hideControls", "__inputs"):
            data.pop(legacy)
        return data


def dashboard(title: str, uid: str, description: str,
              sections: Sequence[tuple[str, str, Sequence[Panel]]],
              extra_variables: Sequence[Template] = (),
              variables: Sequence[Template] = (CLUSTER, HOST, JOB, INSTANCE, MODEL),
              time_from: str = "now-3h") -> ModernDashboard:
    return ModernDashboard(
        title=title, uid=uid, description=description, tags=[TAG], editable=True,
        panels=layout(*sections), links=LINKS, schemaVersion=SCHEMA_VERSION,
        templating=Templating(list=[DATASOURCE, *variables, *extra_variables]),
        time=Time(time_from, "now"), refresh="30s", timezone="browser", graphTooltip=1,
    ).auto_panel_ids()


# -- PromQL helpers ----------------------------------------------------------------------------
def per_dp(metric: str, selector: str = SG, by: str = "instance, model_name") -> str:
    """An additive per-DP-rank gauge summed over DP ranks, TP/PP copies collapsed by max."""
    return f"sum by ({by}) (max by ({by}, dp_rank) ({metric}{{{selector}}}))"


def ratio(num: str, den: str) -> str:
    """`num / (den > 0)`: no series (instead of NaN or +Inf) while the denominator is 0."""
    return f"{num}\n  / ({den} > 0)"


def rate(metric: str, selector: str, by: str = "instance", window: str = "$__rate_interval",
         fn: str = "rate") -> str:
    return f"sum by ({by}) ({fn}({metric}{{{selector}}}[{window}]))"


def dp_rate(metric: str, selector: str = SG, by: str = "instance") -> str:
    """A scheduler counter's rate: sum over DP ranks of max over the TP/PP copies (every TP
    rank reports with --enable-metrics-for-all-schedulers)."""
    inner = ", ".join(dict.fromkeys([*(x.strip() for x in by.split(",") if x.strip()),
                                     "instance", "model_name", "dp_rank"]))
    return (f"sum by ({by}) (max by ({inner}) "
            f"(rate({metric}{{{selector}}}[$__rate_interval])))")


def quantile_queries(histogram: str, per: str = "{{instance}} {{model_name}}") -> list:
    """p50/p95/p99 and the mean from the recording rules, all over one window; each legend
    names its quantity's statistic and window (sglang_obs/core/quantities.py)."""
    short = histogram.removesuffix("_seconds")
    stats = [name for name, _ in quantities.QUANTILES] + ["mean"]
    return [(f"{x.record}{{{IM}}}", f"{per} {x.qualifier}")
            for x in (quantities.q(f"{short}_{s}_{quantities.QUANTILE_WINDOW}") for s in stats)]


def bucket_rate(histogram: str, selector: str = SG) -> str:
    return f"sum by (le) (rate({histogram}_bucket{{{selector}}}[$__rate_interval]))"


SERVING = SERVING_ENDPOINTS


# -- where the time to first token goes, and latency by prompt length -------------------------
STAGE = "sglang:per_stage_req_latency_seconds"
PROMPT_CLASS_BOUNDS = THRESHOLDS["request_classes"]["prompt_tokens_bounds"]
CLASS_BOUNDS_TEXT = ", ".join(f"{b // 1024}K" for b in PROMPT_CLASS_BOUNDS)


def _mean(histogram: str, selector: str = SG) -> str:
    """A scheduler histogram's mean per request (sum over DP ranks of max over TP copies)."""
    return ratio(dp_rate(f"{histogram}_sum", selector), dp_rate(f"{histogram}_count", selector))


def ttft_decomposition(w: int = 12, h: int = 8) -> TimeSeries:
    """Mean seconds per request in each part of the time to first token, stacked: queueing
    (queue_time), scheduler intake (stage request_process, 0.5.12+), prefill of all its chunks
    (stage prefill_forward) and the rest of TTFT (tokenizing, dispatch, first token out)."""
    queue = _mean("sglang:queue_time_seconds")
    intake = _mean(STAGE, f'{SG}, stage="request_process"')
    prefill = _mean(STAGE, f'{SG}, stage="prefill_forward"')
    ttft = ratio(rate("sglang:time_to_first_token_seconds_sum", SG),
                 rate("sglang:time_to_first_token_seconds_count", SG))
    rest = (f"clamp_min(\n  ({ttft})\n  - ({queue})\n  - (({intake}) or 0 * ({queue}))"
            f"\n  - ({prefill}),\n  0)")
    return timeseries(
        "TTFT decomposition",
        "Where the time to first token goes, mean per request, stacked: queueing (queue_time), "
        "scheduler intake (per_stage request_process, 0.5.12+), prefill of all its chunks "
        "(per_stage prefill_forward, 0.5.3+) and the rest of TTFT; needs the per-stage histogram.",
        [(queue, "{{instance}} queueing"), (intake, "{{instance}} scheduler intake"),
         (prefill, "{{instance}} prefill (all chunks)"),
         (rest, "{{instance}} rest (tokenize, dispatch, first token out)")],
        SECONDS, w=w, h=h, min_=0, stack=True)


def by_class(rule_or_histogram: str, q: float | None = None) -> str:
    """A per-class quantile: the 5 min recording rule, or one over $__rate_interval."""
    if q is None:
        return f"{rule_or_histogram}{{{IM}}}"
    return (f"histogram_quantile({q}, sum by (instance, prompt_class, le) (rate("
            f"{rule_or_histogram}_bucket{{{EXM}}}[$__rate_interval])))")


def ttft_by_class(w: int = 12, h: int = 8) -> TimeSeries:
    return timeseries(
        "TTFT p95 by prompt length",
        f"TTFT p95 per prompt-length class (bounds {CLASS_BOUNDS_TEXT} tokens) from SGLang's "
        "request records (exporter --sglang.request-metrics-dir; 5 min rule).",
        [(by_class("instance_model_prompt_class:sglang_obs_request_ttft_seconds:p95_5m"),
          "{{instance}} {{prompt_class}}")],
        SECONDS, w=w, h=h, min_=0, thresholds=steps("green", (slo_seconds("ttft"), "red")))


# -- rendering: the one wrapper around grafanalib's private _gen -------------------------------
DASHBOARD_SUFFIX = ".dashboard.py"


def sources(directory: Path = HERE) -> list[Path]:
    return sorted(directory.glob("*" + DASHBOARD_SUFFIX))


def json_path(source: Path) -> Path:
    return source.with_name(source.name[: -len(DASHBOARD_SUFFIX)] + ".json")


def render(source: Path) -> str:
    """Load a `*.dashboard.py` with grafanalib's loader and serialise it as grafanalib does
    (sort_keys, indent 2, trailing newline). grafanalib._gen is private: only this calls it."""
    from grafanalib import _gen

    definition = _gen.loader(str(source))
    buffer = io.StringIO()
    _gen.write_dashboard(definition, buffer)
    return buffer.getvalue()
