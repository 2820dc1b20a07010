// Package grafana_test checks the Grafana dashboard against the metrics the
// binaries register: every gputopo_* series a panel queries must exist, and
// every gputopo metric must be shown somewhere.
package grafana_test

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gputopo/gputopo/pkg/controller"
	"github.com/gputopo/gputopo/pkg/kubeletplugin"
)

// capture records collectors instead of registering them.
type capture struct{ cs []prometheus.Collector }

func (c *capture) Register(x prometheus.Collector) error   { c.cs = append(c.cs, x); return nil }
func (c *capture) MustRegister(xs ...prometheus.Collector) { c.cs = append(c.cs, xs...) }
func (c *capture) Unregister(prometheus.Collector) bool    { return true }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// registered returns the names of the gputopo metrics and whether each is
// a histogram (queried through _bucket, _sum and _count).
func registered(t *testing.T) map[string]bool {
	t.Helper()
	c := &capture{}
	controller.NewMetrics(c)
	kubeletplugin.NewMetrics(c)
	names := map[string]bool{}
	for _, col := range c.cs {
		ch := make(chan *prometheus.Desc, 16)
		go func() { col.Describe(ch); close(ch) }()
		_, isHist := col.(prometheus.Histogram)
		if _, vec := col.(*prometheus.HistogramVec); vec {
			isHist = true
		}
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the name of %s", d)
			}
			names[m[1]] = isHist
		}
	}
	if len(names) < 10 {
		t.Fatalf("found only %d gputopo metrics: %v", len(names), names)
	}
	return names
}

type panel struct {
	ID      int                       `json:"id"`
	Type    string                    `json:"type"`
	Title   string                    `json:"title"`
	GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("gputopo-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID           string  `json:"uid"`
		Title         string  `json:"title"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("gputopo-dashboard.json is not valid JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 || len(d.Panels) == 0 {
		t.Fatalf("dashboard lacks uid, title, schemaVersion or panels")
	}
	names := registered(t)
	used := map[string]bool{}
	ids := map[int]bool{}
	metricRef := regexp.MustCompile(`gputopo_[a-z_]+`)
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: bad gridPos %+v", p.Title, p.GridPos)
		}
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for _, tg := range p.Targets {
			for _, ref := range metricRef.FindAllString(tg.Expr, -1) {
				base := ref
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(ref, suffix); ok && names[b] {
						base = b
					}
				}
				isHist, ok := names[base]
				switch {
				case !ok:
					t.Errorf("panel %q queries %s, which no gputopo binary exports", p.Title, ref)
				case isHist && base == ref:
					t.Errorf("panel %q queries histogram %s without _bucket/_sum/_count", p.Title, ref)
				}
				used[base] = true
			}
		}
	}
	var unused []string
	for n := range names {
		if !used[n] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Errorf("metrics not shown on the dashboard: %v", unused)
	}
}
