// Live time-series charts (uPlot). Each chart keeps its last data in
// window.freesanCharts[id] so tests (and the curious) read numbers, not pixels.
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

window.freesanCharts = window.freesanCharts || {};
const COLORS = ['#1f5fa8', '#b3261e', '#2e7d32', '#8a4b00', '#6a1b9a'];

export class LiveChart {
  // series: [{label, unit}]; opts.x: 'time' (UNIX seconds) or a label for a numeric x axis.
  constructor(el, id, series, { height = 180, x = 'time', yLabel = '', yRange = null } = {}) {
    this.el = el; this.id = id; this.series = series;
    const width = Math.max(280, el.clientWidth || 600);
    this.plot = new uPlot({
      width, height,
      scales: { x: { time: x === 'time' }, y: yRange ? { range: yRange } : { range: (u, lo, hi) => [Math.min(0, lo ?? 0), Math.max(1, (hi ?? 1) * 1.1)] } },
      axes: [{ label: x === 'time' ? '' : x, stroke: '#333' }, { label: yLabel, stroke: '#333', size: 60 }],
      legend: { live: false },
      series: [{}, ...series.map((s, i) => ({ label: s.label, stroke: COLORS[i % COLORS.length], width: 2, points: { show: s.points ?? false } }))],
    }, [[], ...series.map(() => [])], el);
    this.plot.root.setAttribute('role', 'img');
    this.plot.root.setAttribute('aria-label', `${id}: ${series.map((s) => s.label).join(', ')}`);
    this.resize = () => this.plot.setSize({ width: Math.max(280, el.clientWidth || 600), height });
    window.addEventListener('resize', this.resize);
  }
  set(xs, ys) {
    window.freesanCharts[this.id] = { x: xs, series: Object.fromEntries(this.series.map((s, i) => [s.label, ys[i]])) };
    this.plot.setData([xs, ...ys]);
  }
  destroy() { window.removeEventListener('resize', this.resize); this.plot.destroy(); delete window.freesanCharts[this.id]; }
}

// History samples (contract: {t: UNIX_MS, ...}) to chart columns.
export function columns(samples, keys) {
  const s = samples || [];
  return [s.map((p) => p.t / 1000), keys.map((k) => s.map((p) => p[k] ?? null))];
}
