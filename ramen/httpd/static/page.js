// ramen's own dashboard page: charts of Graphite targets over one time range, drawn with uPlot.
//
// Hand-written, no build step, no framework. It speaks only httpd's HTTP API:
//   /metrics/find?format=json      the series a search matches, each by its path, for the picker
//   /render/batch                  every chart's render in one request when all are refreshed, so
//                                  that the supervisor's merge delay joins their replays (one
//                                  archive read) past the browser's 6 connections to a host; each
//                                  chart still gets its own answer or error
//   /render?format=json            one chart alone (its targets changed)
//   /progress?requestId=           how far a running render's replay is
//   /dashboards[/NAME]             saved dashboards (the confserver's dashboards/<name>)
// The URL names the dashboard and the range (?dashboard=NAME&from=-6h&until=now), or an unsaved
// dashboard's charts (?chart1=T&chart1=T2&chart2=T3), so it can be shared.
//
// For tests and for the curious, window.ramenCharts holds each chart's state and the data drawn,
// and window.ramenPage a few controls (see the end of this file).
"use strict";

(function () {
  const PRESETS = ["-15min", "-1h", "-6h", "-24h", "-7d"];
  const DEFAULT_FROM = "-1h";
  const DEFAULT_UNTIL = "now";
  const PROGRESS_POLL_MS = 300;   // often enough to see a replay move, rare enough to cost nothing
  const SEARCH_DEBOUNCE_MS = 250; // a pause in typing, not every key, queries the tree
  const CHART_HEIGHT_PX = 260;
  const MIN_ZOOM_PX = 3;          // a narrower drag is a click, not a range
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                  "#7f7f7f", "#bcbd22", "#17becf"];

  const $ = (id) => document.getElementById(id);

  // What the page shows: saved as a dashboard's value (ramen/httpd/dashboards.py: Dashboard).
  const state = {
    name: "",          // the dashboard's name; "" for an unsaved one
    saved: false,      // the charts are the saved dashboard's, so the URL may name it alone
    from: DEFAULT_FROM,
    until: DEFAULT_UNTIL,
    refresh_s: 0,
    charts: [],        // [{title, targets: [..]}]
  };
  const views = [];    // per chart: its DOM, its uPlot, its render's state
  let selected = 0;    // the chart the picker adds to
  let refreshTimer = null;
  let renderGeneration = 0;
  let requestCounter = 0;
  const pageId = Math.random().toString(36).slice(2, 10);

  // ---- one line out of an HTTP answer -------------------------------------------------------

  async function reasonOf(response) {
    let text = "";
    try { text = await response.text(); } catch (e) { /* no body */ }
    const line = text.split("\n").map((l) => l.trim()).find((l) => l) || response.statusText;
    return `${response.status}: ${line}`;
  }

  async function fetchJson(url, options) {
    const response = await fetch(url, options);
    if (!response.ok) throw new Error(await reasonOf(response));
    return response.status === 204 ? null : response.json();
  }

  // ---- the URL ------------------------------------------------------------------------------

  function writeUrl() {
    const params = new URLSearchParams();
    if (state.name && state.saved) {
      params.set("dashboard", state.name);
    } else {
      if (state.name) params.set("name", state.name);
      state.charts.forEach((chart, i) => {
        if (chart.title) params.set(`title${i + 1}`, chart.title);
        if (!chart.targets.length) params.append(`chart${i + 1}`, "");
        chart.targets.forEach((t) => params.append(`chart${i + 1}`, t));
      });
    }
    params.set("from", state.from);
    params.set("until", state.until);
    if (state.refresh_s) params.set("refresh", String(state.refresh_s));
    history.replaceState(null, "", `${location.pathname}?${params}`);
  }

  function chartsFromUrl(params) {
    const charts = [];
    for (let i = 1; params.has(`chart${i}`); i++) {
      charts.push({title: params.get(`title${i}`) || "",
                   targets: params.getAll(`chart${i}`).filter((t) => t.trim())});
    }
    return charts;
  }

  // ---- the range and refresh controls ---------------------------------------------------------

  function showRange() {
    $("from").value = state.from;
    $("until").value = state.until;
    $("preset").value = state.until === "now" && PRESETS.includes(state.from) ? state.from : "";
    $("refresh").value = String(state.refresh_s);
    const fromEpoch = /^\d+$/.test(state.from), untilEpoch = /^\d+$/.test(state.until);
    $("abs-from").value = fromEpoch ? toLocalInput(Number(state.from)) : "";
    $("abs-until").value = untilEpoch ? toLocalInput(Number(state.until)) : "";
  }

  // datetime-local inputs hold UTC here: ramen's times are UTC everywhere (ramen/times.py).
  function toLocalInput(epochS) { return new Date(epochS * 1000).toISOString().slice(0, 19); }
  function fromLocalInput(text) { return Math.round(Date.parse(text + "Z") / 1000); }

  function setRange(from, until) {
    state.from = from;
    state.until = until;
    showRange();
    writeUrl();
    refreshAll();
  }

  function setAutoRefresh(seconds) {
    state.refresh_s = seconds;
    if (refreshTimer) clearInterval(refreshTimer);
    refreshTimer = null;
    if (seconds > 0) {
      refreshTimer = setInterval(() => { if (!rendering()) refreshAll(); }, seconds * 1000);
    }
    showRange();
    writeUrl();
  }

  // ---- charts -------------------------------------------------------------------------------

  function edited() {
    state.saved = false;
    writeUrl();
  }

  function addChart(chart, {render = true} = {}) {
    state.charts.push(chart);
    const index = state.charts.length - 1;
    const node = $("chart-template").content.firstElementChild.cloneNode(true);
    const view = {
      node, chart, plot: null, abort: null, requestId: null,
      public: {title: chart.title, targets: chart.targets, state: "idle", error: "", from: null,
               until: null, series: [], data: null, renders: 0, progress: null},
    };
    views.push(view);
    $("charts").appendChild(node);
    node.querySelector(".chart-title").value = chart.title;
    node.querySelector(".chart-title").addEventListener("change", (e) => {
      chart.title = view.public.title = e.target.value;
      edited();
    });
    node.addEventListener("click", () => select(views.indexOf(view)));
    node.querySelector(".chart-remove").addEventListener("click", (e) => {
      e.stopPropagation();
      removeChart(views.indexOf(view));
    });
    node.querySelector(".chart-add-target").addEventListener("submit", () => {
      const input = node.querySelector(".chart-target-input");
      const target = input.value.trim();
      if (!target) return;
      input.value = "";
      addTarget(views.indexOf(view), target);
    });
    showTargets(view);
    refreshChartChoices();
    select(index);
    exposeCharts();
    if (render) renderChart(view, renderGeneration);
    return view;
  }

  function removeChart(index) {
    const view = views[index];
    if (view.abort) view.abort.abort();
    if (view.plot) view.plot.destroy();
    view.node.remove();
    views.splice(index, 1);
    state.charts.splice(index, 1);
    selected = Math.min(selected, views.length - 1);
    refreshChartChoices();
    exposeCharts();
    edited();
  }

  function clearCharts() {
    while (views.length) {
      const view = views.pop();
      if (view.abort) view.abort.abort();
      if (view.plot) view.plot.destroy();
      view.node.remove();
    }
    state.charts = [];
    selected = 0;
  }

  function addTarget(index, target) {
    const view = views[index];
    view.chart.targets.push(target);
    showTargets(view);
    edited();
    renderChart(view, renderGeneration);
  }

  function showTargets(view) {
    const list = view.node.querySelector(".chart-targets");
    list.replaceChildren();
    view.chart.targets.forEach((target, i) => {
      const item = document.createElement("li");
      const input = document.createElement("input");
      input.className = "chart-target";
      input.value = target;
      input.addEventListener("change", () => {
        const value = input.value.trim();
        if (value) view.chart.targets[i] = value; else view.chart.targets.splice(i, 1);
        showTargets(view);
        edited();
        renderChart(view, renderGeneration);
      });
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "chart-target-remove";
      remove.textContent = "✕";
      remove.title = "Remove this target";
      remove.addEventListener("click", () => {
        view.chart.targets.splice(i, 1);
        showTargets(view);
        edited();
        renderChart(view, renderGeneration);
      });
      item.append(input, remove);
      list.appendChild(item);
    });
  }

  function select(index) {
    selected = index;
    views.forEach((v, i) => v.node.classList.toggle("selected", i === index));
    $("add-to").value = String(index);
  }

  function refreshChartChoices() {
    const choices = $("add-to");
    choices.replaceChildren(...views.map((view, i) => {
      const option = document.createElement("option");
      option.value = String(i);
      option.textContent = `chart ${i + 1}`;
      return option;
    }));
    choices.value = String(selected);
  }

  // ---- rendering ------------------------------------------------------------------------------

  function rendering() { return views.some((v) => v.public.state === "loading"); }

  // Every chart's render is asked at once, in one request (POST /render/batch): the server asks for
  // all their replays together, so the supervisor's merge delay joins them (one archive read),
  // whatever the browser's limit of 6 connections to a host. Each chart still gets its own error.
  function refreshAll() {
    renderGeneration += 1;
    const generation = renderGeneration;
    const batch = batchFetcher(views.filter((v) => v.chart.targets.length).length);
    views.forEach((view) => renderChart(view, generation, batch));
  }

  // Gathers the renders of `expected` charts, sends them as one batch once all have asked, and
  // gives each its own answer or its own error.
  function batchFetcher(expected) {
    const renders = [];
    const waiting = [];
    return (params) => new Promise((resolve, reject) => {
      renders.push({targets: params.getAll("target"), maxDataPoints: Number(params.get("maxDataPoints")),
                    requestId: params.get("requestId")});
      waiting.push({resolve, reject});
      if (renders.length < expected) return;
      const body = JSON.stringify({from: state.from, until: state.until, renders});
      fetchJson("/render/batch", {method: "POST", headers: {"Content-Type": "application/json"}, body})
        .then((answers) => answers.forEach((answer, i) => {
          if (answer.error !== undefined) waiting[i].reject(new Error(`${answer.status}: ${answer.error}`));
          else waiting[i].resolve(answer.series);
        }), (error) => waiting.forEach((w) => w.reject(error)));
    });
  }

  function plotWidth(view) {
    return Math.max(200, view.node.querySelector(".chart-plot").clientWidth || view.node.clientWidth - 16);
  }

  async function renderChart(view, generation, fetcher = null) {
    if (view.abort) view.abort.abort();
    const pub = view.public;
    pub.from = state.from;
    pub.until = state.until;
    if (!view.chart.targets.length) {
      pub.state = "idle";
      pub.error = "";
      pub.series = [];
      pub.data = null;
      showStatus(view, "add a target: pick a series or type one");
      showError(view, "");
      draw(view, []);
      return;
    }
    const abort = new AbortController();
    view.abort = abort;
    requestCounter += 1;
    const requestId = `${pageId}-${requestCounter}`;
    view.requestId = requestId;
    const params = new URLSearchParams();
    view.chart.targets.forEach((t) => params.append("target", t));
    params.set("from", state.from);
    params.set("until", state.until);
    params.set("format", "json");
    params.set("maxDataPoints", String(plotWidth(view)));
    params.set("requestId", requestId);
    pub.state = "loading";
    pub.progress = null;
    showStatus(view, "rendering…");
    pollProgress();
    let series;
    try {
      series = await (fetcher ? fetcher(params) : fetchJson(`/render?${params}`, {signal: abort.signal}));
    } catch (e) {
      if (abort.signal.aborted) return;  // a newer render of this chart took over
      view.abort = null;
      pub.state = "error";
      pub.error = e.message;
      pub.renders += 1;
      pub.series = [];
      pub.data = null;
      showStatus(view, "");
      showError(view, e.message);
      draw(view, []);
      return;
    }
    if (abort.signal.aborted) return;
    view.abort = null;
    pub.series = series;
    pub.error = "";
    showError(view, "");
    const points = series.reduce((n, s) => n + s.datapoints.filter((p) => p[0] !== null).length, 0);
    showStatus(view, series.length ? `${series.length} series, ${points} points` : "no data in this range");
    draw(view, series);
    pub.data = view.plot ? view.plot.data.map((column) => Array.from(column)) : null;
    pub.renders += 1;
    pub.state = "done";
  }

  // uPlot wants one x column and one y column per series on it; Graphite's series may have
  // different steps, so x is the union of their times and each y is null where it has no point.
  function aligned(series) {
    const times = new Set();
    series.forEach((s) => s.datapoints.forEach((p) => times.add(p[1])));
    const xs = Array.from(times).sort((a, b) => a - b);
    const at = new Map(xs.map((t, i) => [t, i]));
    const ys = series.map((s) => {
      const column = new Array(xs.length).fill(null);
      s.datapoints.forEach(([value, t]) => { column[at.get(t)] = value; });
      return column;
    });
    return [xs, ...ys];
  }

  function draw(view, series) {
    if (view.plot) { view.plot.destroy(); view.plot = null; }
    if (!series.length) return;
    const options = {
      width: plotWidth(view),
      height: CHART_HEIGHT_PX,
      // ramen's times are UTC everywhere (ramen/times.py), so are the axes.
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
      cursor: {drag: {x: true, y: false, setScale: false}},
      series: [{}, ...series.map((s, i) => ({
        label: s.target, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false,
        points: {show: s.datapoints.length < 60},
      }))],
      axes: [{}, {values: (u, ticks) => ticks.map(compact), size: yAxisSize}],
      hooks: {setSelect: [(u) => zoomed(u)]},
    };
    view.plot = new uPlot(options, aligned(series), view.node.querySelector(".chart-plot"));
  }

  // Counters run to millions: 1.23M reads better than 1230000 and fits the axis.
  function compact(value) {
    if (value === null) return "";
    const size = Math.abs(value);
    for (const [unit, scale] of [["T", 1e12], ["G", 1e9], ["M", 1e6], ["k", 1e3]]) {
      if (size >= scale) return `${+(value / scale).toPrecision(4)}${unit}`;
    }
    return String(+value.toPrecision(4));
  }

  // Wide enough for the longest label (uPlot's default clips long ones).
  function yAxisSize(u, values) {
    const longest = Math.max(3, ...(values || []).map((v) => v.length));
    return 16 + longest * 8;
  }

  // A drag on any chart narrows the page's range to it, and every chart renders over it.
  function zoomed(u) {
    if (u.select.width < MIN_ZOOM_PX) return;
    const from = Math.floor(u.posToVal(u.select.left, "x"));
    const until = Math.ceil(u.posToVal(u.select.left + u.select.width, "x"));
    u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
    if (until > from) setRange(String(from), String(until));
  }

  function showStatus(view, text) {
    const status = view.node.querySelector(".chart-status");
    status.textContent = text;
  }

  function showError(view, text) {
    const error = view.node.querySelector(".chart-error");
    error.textContent = text;
    error.hidden = !text;
  }

  // One progress request in flight at most, cycling over the running renders: the browser keeps
  // few connections per host, and those belong to the renders.
  let polling = false;
  async function pollProgress() {
    if (polling) return;
    polling = true;
    try {
      let turn = 0;
      for (;;) {
        const running = views.filter((v) => v.public.state === "loading" && v.requestId);
        if (!running.length) break;
        await new Promise((resolve) => setTimeout(resolve, PROGRESS_POLL_MS));
        const view = running[turn++ % running.length];
        if (view.public.state !== "loading") continue;
        const requestId = view.requestId;
        let progress;
        try {
          progress = await fetchJson(`/progress?requestId=${encodeURIComponent(requestId)}`);
        } catch (e) {
          continue;  // progress is a nicety: a render's own answer says what went wrong
        }
        if (view.public.state !== "loading" || view.requestId !== requestId) continue;
        view.public.progress = progress;
        if (progress && progress.state === "running") {
          const replays = progress.replays_done === undefined
            ? `${progress.replays} replay${progress.replays === 1 ? "" : "s"}`
            : `${progress.replays_done} of ${progress.replays} replay${progress.replays === 1 ? "" : "s"} done`;
          showStatus(view, `replaying: ${Number(progress.rows).toLocaleString("en")} rows, ${replays}, ` +
                           `${Number(progress.elapsed_s).toFixed(1)} s`);
        }
      }
    } finally {
      polling = false;
    }
  }

  function exposeCharts() {
    window.ramenCharts = views.map((v) => v.public);
  }

  // ---- the series picker ----------------------------------------------------------------------

  let searchTimer = null;
  let searchCounter = 0;

  function searchSoon() {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => search($("search").value.trim()), SEARCH_DEBOUNCE_MS);
  }

  async function search(text) {
    // Without a glob, what starts with the text: typing "net.traffic" lists "net.traffic*"; and
    // "net." (a level finished) lists what is below it, "net.*".
    const query = !text || text.endsWith(".") ? `${text}*` : /[*?[{]/.test(text) ? text : `${text}*`;
    const mine = ++searchCounter;
    const status = $("search-status");
    status.classList.remove("error");
    status.textContent = "searching…";
    let nodes;
    try {
      // Every match by its path (treejson, Grafana's, lists a name once: "net.per_minute.*.bytes"
      // showed host00's alone).
      nodes = await fetchJson(`/metrics/find?${new URLSearchParams({query, format: "json"})}`);
    } catch (e) {
      if (mine !== searchCounter) return;
      status.classList.add("error");
      status.textContent = e.message;
      $("search-results").replaceChildren();
      return;
    }
    if (mine !== searchCounter) return;
    status.textContent = nodes.length ? `${query}: ${nodes.length}` : `${query}: nothing matches`;
    $("search-results").replaceChildren(...nodes.map((node) => {
      const item = document.createElement("li");
      item.textContent = node.path;
      item.dataset.id = node.path;
      item.className = node.is_leaf ? "leaf" : "branch";
      item.title = node.is_leaf ? "add to the chart" : "list what is below";
      item.addEventListener("click", () => {
        if (node.is_leaf) {
          if (!views.length) addChart({title: "", targets: []}, {render: false});
          addTarget(Number($("add-to").value || selected), node.path);
        } else {
          $("search").value = `${node.path}.*`;
          search(`${node.path}.*`);
        }
      });
      return item;
    }));
  }

  // ---- dashboards -----------------------------------------------------------------------------

  function dashboardStatus(text, isError) {
    const status = $("dashboard-status");
    status.textContent = text;
    status.classList.toggle("error", !!isError);
  }

  async function listDashboards() {
    let names;
    try {
      names = await fetchJson("/dashboards");
    } catch (e) {
      dashboardStatus(`cannot list dashboards: ${e.message}`, true);
      return;
    }
    const choices = $("dashboards");
    const first = choices.options[0];
    choices.replaceChildren(first, ...names.map((name) => {
      const option = document.createElement("option");
      option.value = option.textContent = name;
      return option;
    }));
    choices.value = names.includes(state.name) ? state.name : "";
  }

  function currentValue() {
    return {name: state.name, charts: state.charts.map((c) => ({title: c.title, targets: c.targets.slice()})),
            from: state.from, until: state.until, refresh_s: state.refresh_s};
  }

  async function save() {
    const name = $("dashboard-name").value.trim();
    if (!name) { dashboardStatus("name the dashboard to save it", true); return; }
    state.name = name;
    try {
      await fetchJson(`/dashboards/${encodeURIComponent(name)}`, {
        method: "PUT", headers: {"Content-Type": "application/json"}, body: JSON.stringify(currentValue()),
      });
    } catch (e) {
      dashboardStatus(`not saved: ${e.message}`, true);
      return;
    }
    state.saved = true;
    writeUrl();
    dashboardStatus(`saved ${name}`);
    listDashboards();
  }

  // `range` (from the URL) wins over the dashboard's own, so a shared link shows what its sender saw.
  async function load(name, range) {
    let value;
    try {
      value = await fetchJson(`/dashboards/${encodeURIComponent(name)}`);
    } catch (e) {
      dashboardStatus(`cannot load ${name}: ${e.message}`, true);
      return false;
    }
    clearCharts();
    state.name = value.name;
    $("dashboard-name").value = value.name;
    state.from = (range && range.from) || value.from;
    state.until = (range && range.until) || value.until;
    value.charts.forEach((c) => addChart({title: c.title, targets: c.targets.slice()}, {render: false}));
    select(0);
    state.saved = true;
    setAutoRefresh(range && range.refresh !== null ? range.refresh : value.refresh_s);
    dashboardStatus(`loaded ${name}`);
    $("dashboards").value = name;
    refreshAll();
    return true;
  }

  async function remove() {
    const name = $("dashboard-name").value.trim() || $("dashboards").value;
    if (!name) { dashboardStatus("name the dashboard to delete", true); return; }
    try {
      await fetchJson(`/dashboards/${encodeURIComponent(name)}`, {method: "DELETE"});
    } catch (e) {
      dashboardStatus(`not deleted: ${e.message}`, true);
      return;
    }
    if (state.name === name) state.saved = false;
    writeUrl();
    dashboardStatus(`deleted ${name}`);
    listDashboards();
  }

  // ---- start ----------------------------------------------------------------------------------

  function wire() {
    $("preset").addEventListener("change", (e) => { if (e.target.value) setRange(e.target.value, "now"); });
    $("range").addEventListener("submit", () => {
      const from = $("from").value.trim() || DEFAULT_FROM, until = $("until").value.trim() || DEFAULT_UNTIL;
      setRange(from, until);
    });
    const absolute = () => {
      if ($("abs-from").value && $("abs-until").value) {
        setRange(String(fromLocalInput($("abs-from").value)), String(fromLocalInput($("abs-until").value)));
      }
    };
    $("abs-from").addEventListener("change", absolute);
    $("abs-until").addEventListener("change", absolute);
    $("refresh").addEventListener("change", (e) => setAutoRefresh(Number(e.target.value)));
    $("refresh-now").addEventListener("click", refreshAll);
    $("add-chart").addEventListener("click", () => { addChart({title: "", targets: []}); edited(); });
    $("add-to").addEventListener("change", (e) => select(Number(e.target.value)));
    $("search").addEventListener("input", searchSoon);
    $("dashboard").addEventListener("submit", save);
    $("dashboards").addEventListener("change", (e) => {
      if (e.target.value) load(e.target.value, null).then(() => writeUrl());
    });
    $("delete").addEventListener("click", remove);
    $("dashboard-name").addEventListener("change", (e) => { state.name = e.target.value.trim(); edited(); });
    window.addEventListener("resize", () => views.forEach((v) => {
      if (v.plot) v.plot.setSize({width: plotWidth(v), height: CHART_HEIGHT_PX});
    }));
  }

  async function start() {
    wire();
    const params = new URLSearchParams(location.search);
    const range = {from: params.get("from"), until: params.get("until"),
                   refresh: params.has("refresh") ? Number(params.get("refresh")) || 0 : null};
    listDashboards();
    search("");
    if (params.get("dashboard") && await load(params.get("dashboard"), range)) return;
    state.from = range.from || DEFAULT_FROM;
    state.until = range.until || DEFAULT_UNTIL;
    state.name = params.get("name") || "";
    $("dashboard-name").value = state.name;
    const charts = chartsFromUrl(params);
    (charts.length ? charts : [{title: "", targets: []}]).forEach((c) => addChart(c, {render: false}));
    select(0);
    setAutoRefresh(range.refresh || 0);
    refreshAll();
  }

  window.ramenPage = {
    state,
    // True once every chart has its answer (or error) for the current range and targets.
    idle: () => !rendering(),
    refreshAll,
    setRange,
    addChart: (targets, title) => { addChart({title: title || "", targets: targets.slice()}); edited(); },
    addTarget,
    save,
  };
  exposeCharts();
  start();
})();
