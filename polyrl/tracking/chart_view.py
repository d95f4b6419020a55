"""A saved chart view of an experiment's runs in the MLflow UI: step curves, one line per arm.

MLflow's experiment page has a chart mode (``compareRunsMode=CHART``) whose state — which
runs, grouped how, which charts — lives in the browser, except for *shared views*: the UI's
Share button stores the state as the experiment tag ``mlflow.sharedViewState.<key>`` and
links to ``…/runs?viewStateShareKey=<key>``. polyrl writes that tag itself, so the URL it
prints opens with the comparison's curves drawn, no clicks: the runs of one experiment run,
each drawn in its arm's colour (``mlflow.runColor``), a first chart section with the metrics
compared, and below it a section per prefix of the runs' other metrics, all one
card a row so that the UI does not cut the cards' titles. The state's shape is MLflow 3.17's UI (``ExperimentPageUIState``
and its chart cards, read from the UI bundle): keys it does not know are ignored, and keys it
lacks take the UI's defaults, so another MLflow version opens the same page with fewer settings.

MLflow 3.17 colours a group of runs (``groupBy``) from ``experimentRunColors`` in the browser's
localStorage (set by its colour picker) or else a hash of the group's id; a run's
``mlflow.runColor`` tag colours that run only. Nothing in the view state or in tags colours a
group, so a view that groups seeds by arm draws arms in colours polyrl cannot choose (two of
them came out grey and dark blue). The view polyrl links to therefore draws runs, not groups.
Nor can a shared view hide some of its runs: the UI drops ``runsHidden``, ``runsVisibilityMap``,
``runsPinned`` and ``runsExpanded`` from it when it opens (they stay the reader's own), so a run
the view should not draw is left out of its filter.
"""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
SECTION_NAME = "polyrl comparison"
SECTION_ID = "polyrl-comparison"
# One chart a row (the UI's default is three). On the experiment page MLflow 3.17 titles a card by
# its metric key whatever its displayName says (the page renders its chart sections with
# ``useMetricDisplayName: false``; the card's title is then ``selectedMetricKeys[0]``, cut with an
# ellipsis to the card's header), so only the card's width can make a title readable. Measured in
# headless Chromium at 1400 px with MLflow's Assistant panel open (tests/tracking/
# test_chart_view_titles.py): three a row cut every title to "ev..."; two a row left a 73 px title
# for a 205 px key ("eval/arithmetic_chat/length/mean"); one a row gives it 332 px.
SECTION_COLUMNS = 1
# Cards a little lower than the UI's 360 px: one a row, the six headline curves stay a short scroll.
SECTION_CARD_HEIGHT = 300
RUN_COLOUR_TAG = "mlflow.runColor"  # the UI draws a run in this colour (its colour picker sets it)
# Arm colours a reader tells apart, from the UI's own palette, in the order arms are listed. The UI's
# default colour is a hash of the run id, which drew two arms in two near-identical blue-greys.
ARM_COLOURS: tuple[str, ...] = ("#2272b4", "#de7921", "#308613", "#c83243", "#8a63bf", "#04867d", "#b45091", "#a6630c")


def view_key(parent_run_id: str) -> str:
    """One saved view per experiment run; re-running ``polyrl compare`` rewrites it."""
    return f"polyrl-{parent_run_id}"


def seeds_view_key(parent_run_id: str) -> str:
    """The second saved view of a seeded experiment run: its seed runs grouped by arm."""
    return f"{view_key(parent_run_id)}-seeds"


def arm_colours(arms: list[str]) -> dict[str, str]:
    """Each arm's colour, in order (the palette repeats past its length)."""
    return {arm: ARM_COLOURS[i % len(ARM_COLOURS)] for i, arm in enumerate(dict.fromkeys(arms))}


def colour_runs(client: MlflowClient, run_arms: dict[str, str]) -> dict[str, str]:
    """Tag each run (run id → its arm) with its arm's colour; returns run id → colour."""
    colours = arm_colours(list(run_arms.values()))
    for run_id, arm in run_arms.items():
        client.set_tag(run_id, RUN_COLOUR_TAG, colours[arm])
    return {run_id: colours[arm] for run_id, arm in run_arms.items()}


def line_chart(metric_key: str, index: int) -> dict:
    """A step-curve card of ``metric_key`` in the comparison section (MLflow's LINE card)."""
    return {
        "uuid": f"{SECTION_ID}-{index}",
        "type": "LINE",
        "metricSectionId": SECTION_ID,
        "deleted": False,
        "isGenerated": False,
        "runsCountToCompare": 10,
        "displayName": metric_key,  # unused on the experiment page (see SECTION_COLUMNS), kept as the key
        "metricKey": metric_key,
        "selectedMetricKeys": [metric_key],
        "lineSmoothness": 0,
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "range": {},
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "",
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": False,
        "useGlobalLineSmoothing": True,
    }


def run_filter(run_ids: list[str]) -> str:
    """The runs table's search filter selecting exactly these runs (one experiment run's, not
    every run the experiment ever had)."""
    return "attributes.run_id IN (" + ", ".join(f"'{run_id}'" for run_id in run_ids) + ")"


def section(uuid: str, name: str) -> dict:
    """A chart section of the experiment page, one card a row (see :data:`SECTION_COLUMNS`)."""
    return {
        "uuid": uuid,
        "name": name,
        "display": True,
        "isReordered": False,
        "deleted": False,
        "isGenerated": False,
        "columns": SECTION_COLUMNS,
        "cardHeight": SECTION_CARD_HEIGHT,
    }


def other_sections(logged_keys: list[str], shown_keys: list[str]) -> list[dict]:
    """Sections for the runs' other metrics, named as the UI names the ones it generates (the key
    up to its last '/': ``actor/clip_frac_high`` goes to ``actor``). The UI fills a section of that
    name when the view has one, and keeps its layout; left to make its own, it lays them out three
    a row, which cut every title. Keys without a '/' and system metrics keep the UI's sections."""
    names = sorted(
        {key.rsplit("/", 1)[0] for key in logged_keys if "/" in key and key not in shown_keys and not key.startswith("system/")}
    )
    return [section(f"{SECTION_ID}-other-{index}", name) for index, name in enumerate(names)]


def chart_view_state(run_ids: list[str], metric_keys: list[str], *, group_by_tag: str | None, other_keys: list[str] = ()) -> dict:
    """The shared-view state: search facets and UI state of the experiment page. ``metric_keys``
    are the comparison section's cards; ``other_keys`` (the runs' other metrics) get sections of
    the same layout below it (:func:`other_sections`), filled by the UI."""
    return {
        "searchFilter": run_filter(run_ids),
        # Sorted by anything but start time, the UI neither nests child runs under their parent
        # nor fetches the parents of the runs shown (sorted by start time, the arm runs went
        # collapsed under the experiment's run, and each seed group counted its arm's run too).
        "orderByKey": "tags.`mlflow.runName`",  # the UI's own "Run Name" sort
        "orderByAsc": True,
        "compareRunCharts": [line_chart(key, index) for index, key in enumerate(metric_keys)],
        "compareRunSections": [section(SECTION_ID, SECTION_NAME), *other_sections(list(other_keys), metric_keys)],
        # Generated sections for the other metrics go below ours, not re-sorted above it.
        "isAccordionReordered": True,
        "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": group_by_tag}]}
        if group_by_tag
        else None,
        "groupsExpanded": {},
        "useGroupedValuesInCharts": True,
        "hideEmptyCharts": True,
        "runsHiddenMode": "SHOW_ALL",  # the UI's default draws only the first 10 rows
        "runListHidden": False,
        "viewMaximized": False,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def save_chart_view(client: MlflowClient, experiment_id: str, key: str, state: dict) -> None:
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG_PREFIX + key, json.dumps(state, separators=(",", ":")))


def load_chart_view(client: MlflowClient, experiment_id: str, key: str) -> dict | None:
    """The saved view's state (``None`` when there is none)."""
    value = client.get_experiment(experiment_id).tags.get(SHARED_VIEW_TAG_PREFIX + key)
    return json.loads(value) if value else None


def view_key_in_url(url: str) -> str:
    """The saved view a :func:`polyrl.tracking.ui_links.chart_view_url` opens."""
    from urllib.parse import parse_qs, unquote, urlparse

    fragment = urlparse(url).fragment
    return unquote(parse_qs(fragment.split("?", 1)[1])["viewStateShareKey"][0])


def run_ids_in_filter(search_filter: str) -> list[str]:
    """The run ids a :func:`run_filter` selects."""
    import re

    return re.findall(r"'([0-9a-f]+)'", search_filter)
