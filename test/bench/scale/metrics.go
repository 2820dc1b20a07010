package scale

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of a Prometheus endpoint, by metric family name.
type Metrics map[string]*dto.MetricFamily

// ParseMetrics reads the Prometheus text format.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return Metrics(fams), nil
}

// matches reports whether the series has every label in match.
func matches(m *dto.Metric, match map[string]string) bool {
	found := 0
	for _, l := range m.GetLabel() {
		if v, ok := match[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			found++
		}
	}
	return found == len(match)
}

// label returns the value of a series' label.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Sum adds the counters, gauges or untyped values of the series that match.
func (ms Metrics) Sum(name string, match map[string]string) float64 {
	return ms.SumBy(name, match)[""]
}

// SumBy is Sum grouped by the values of the given labels, joined by "/".
func (ms Metrics) SumBy(name string, match map[string]string, by ...string) map[string]float64 {
	out := map[string]float64{}
	f := ms[name]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		if matches(m, match) {
			out[seriesKey(m, by)] += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return out
}

func seriesKey(m *dto.Metric, by []string) string {
	key := make([]string, len(by))
	for i, b := range by {
		key[i] = label(m, b)
	}
	return strings.Join(key, "/")
}

// Hist is a cumulative histogram: Buckets[i] observations were <= Bounds[i].
type Hist struct {
	Count, Sum float64
	Bounds     []float64
	Buckets    []float64
}

// Histogram merges the histograms of the series that match.
func (ms Metrics) Histogram(name string, match map[string]string) Hist {
	return ms.HistogramBy(name, match)[""]
}

// HistogramBy merges the histograms of the series that match, grouped by
// the values of the given labels, joined by "/".
func (ms Metrics) HistogramBy(name string, match map[string]string, by ...string) map[string]Hist {
	out := map[string]Hist{}
	f := ms[name]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		if !matches(m, match) || m.GetHistogram() == nil {
			continue
		}
		key := seriesKey(m, by)
		out[key] = out[key].add(histOf(m.GetHistogram()), 1)
	}
	return out
}

// Series returns each histogram series of a family by its labels, rendered
// as name="value" pairs separated by commas.
func (ms Metrics) Series(name string) map[string]Hist {
	out := map[string]Hist{}
	for _, m := range ms[name].GetMetric() {
		if m.GetHistogram() == nil {
			continue
		}
		pairs := make([]string, 0, len(m.GetLabel()))
		for _, l := range m.GetLabel() {
			pairs = append(pairs, l.GetName()+"="+strconv.Quote(l.GetValue()))
		}
		sort.Strings(pairs)
		out[strings.Join(pairs, ",")] = histOf(m.GetHistogram())
	}
	return out
}

// HistogramNames lists the histogram families whose name has the prefix.
func (ms Metrics) HistogramNames(prefix string) []string {
	var out []string
	for name, f := range ms {
		if strings.HasPrefix(name, prefix) && f.GetType() == dto.MetricType_HISTOGRAM {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func histOf(p *dto.Histogram) Hist {
	h := Hist{Count: float64(p.GetSampleCount()), Sum: p.GetSampleSum()}
	for _, b := range p.GetBucket() {
		h.Bounds = append(h.Bounds, b.GetUpperBound())
		h.Buckets = append(h.Buckets, float64(b.GetCumulativeCount()))
	}
	return h
}

// add returns h + sign*o. Histograms of one family share their bounds; a
// histogram without buckets (no series yet) takes the other's.
func (h Hist) add(o Hist, sign float64) Hist {
	out := Hist{Count: h.Count + sign*o.Count, Sum: h.Sum + sign*o.Sum}
	switch {
	case len(h.Bounds) == 0:
		out.Bounds = o.Bounds
		for _, b := range o.Buckets {
			out.Buckets = append(out.Buckets, sign*b)
		}
	case len(o.Bounds) == 0:
		out.Bounds, out.Buckets = h.Bounds, append([]float64(nil), h.Buckets...)
	default:
		out.Bounds = h.Bounds
		for i := range h.Buckets {
			out.Buckets = append(out.Buckets, h.Buckets[i]+sign*o.Buckets[i])
		}
	}
	return out
}

// Sub is what was observed between an earlier scrape o and h.
func (h Hist) Sub(o Hist) Hist { return h.add(o, -1) }

// Mean is the average observation, 0 without any.
func (h Hist) Mean() float64 {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / h.Count
}

// Quantile estimates the q-quantile as Prometheus' histogram_quantile does:
// linear interpolation inside the bucket that holds it, the largest finite
// bound when it falls into the +Inf bucket. NaN without observations.
func (h Hist) Quantile(q float64) float64 {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.Count
	lower, below := 0.0, 0.0
	for i, ub := range h.Bounds {
		if h.Buckets[i] >= rank {
			if math.IsInf(ub, 1) {
				return lower
			}
			in := h.Buckets[i] - below
			if in == 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/in
		}
		lower, below = ub, h.Buckets[i]
	}
	return lower // observations beyond the last bound, which is not +Inf
}

// PlanGoal is the plan time the benchmarks hold the controller's plans to.
// The controller's plan_duration_seconds has a bucket bound there
// (controller.PlanGoal), so the plans above it are counted exactly.
const PlanGoal = 50 * time.Millisecond

// Above counts the observations above bound, which must be one of the
// histogram's bucket bounds for the count to be exact; ok is false when it
// is not.
func (h Hist) Above(bound float64) (n float64, ok bool) {
	for i, ub := range h.Bounds {
		if ub == bound {
			return h.Count - h.Buckets[i], true
		}
	}
	return 0, false
}

// Scraper reads the control plane's and the controller's metrics.
type Scraper struct {
	env    *Env
	client *http.Client
}

// NewScraper prepares scrapes of the cluster's components.
func NewScraper(env *Env) (*Scraper, error) {
	return &Scraper{env: env, client: &http.Client{Timeout: 30 * time.Second}}, nil
}

// APIServer scrapes kube-apiserver.
func (s *Scraper) APIServer(ctx context.Context) (Metrics, error) {
	data, err := s.env.Cluster.Client().Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scrape kube-apiserver metrics: %w", err)
	}
	return ParseMetrics(strings.NewReader(string(data)))
}

// Scheduler scrapes kube-scheduler.
func (s *Scraper) Scheduler(ctx context.Context) (Metrics, error) {
	body, err := s.env.Cluster.SchedulerMetrics(ctx)
	if err != nil {
		return nil, err
	}
	return ParseMetrics(bytes.NewReader(body))
}

// Controller scrapes the gputopo controller.
func (s *Scraper) Controller(ctx context.Context) (Metrics, error) {
	url, err := s.env.Cluster.ControllerMetricsURL()
	if err != nil {
		return nil, err
	}
	return s.get(ctx, s.client, url)
}

// ControllerProfile saves one of the controller's pprof profiles as
// dir/controller-<name>.pprof: "profile" (CPU, over d) or a named one
// (heap, mutex, block). The controller serves them with --profiling.
func (s *Scraper) ControllerProfile(ctx context.Context, name string, d time.Duration, dir string) error {
	metrics, err := s.env.Cluster.ControllerMetricsURL()
	if err != nil {
		return err
	}
	url := strings.TrimSuffix(metrics, "/metrics") + "/debug/pprof/" + name
	if d > 0 {
		url += fmt.Sprintf("?seconds=%d", int(d.Seconds()))
	}
	body, err := fetch(ctx, &http.Client{Timeout: d + time.Minute}, url)
	if err != nil {
		return fmt.Errorf("controller profile (does the controller run with --profiling?): %w", err)
	}
	defer body.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "controller-"+name+".pprof"))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, body); err != nil {
		_ = f.Close()
		return fmt.Errorf("controller profile %s: %w", name, err)
	}
	return f.Close()
}

// APIServerProfile saves kube-apiserver's CPU profile over d as
// dir/apiserver-profile.pprof (kube-apiserver serves it by default).
func (s *Scraper) APIServerProfile(ctx context.Context, d time.Duration, dir string) error {
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	data, err := s.env.Cluster.Client().Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", fmt.Sprint(int(d.Seconds()))).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("kube-apiserver profile: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "apiserver-profile.pprof"), data, 0o644)
}

func (s *Scraper) get(ctx context.Context, c *http.Client, url string) (Metrics, error) {
	body, err := fetch(ctx, c, url)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return ParseMetrics(body)
}

// fetch GETs url and returns the body of a 200 reply.
func fetch(ctx context.Context, c *http.Client, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("scrape %s: %s: %s", url, resp.Status, body)
	}
	return resp.Body, nil
}
