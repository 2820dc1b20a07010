package simulate

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Published is one scheduling policy's allocation ratio in the FGD
// paper's artifact: milli-GPUs allocated over cluster GPUs once the
// arrived demand reaches Tune × the cluster, with GPU sharing and CPU and
// memory limits, mean over Seeds seeds.
type Published struct {
	Policy          string  `json:"policy"`
	AllocationRatio float64 `json:"allocationRatio"`
	Seeds           int     `json:"seeds"`
}

// PublishedFile is where the artifact's allocation results sit beside an
// Alibaba trace in the data directory.
func PublishedFile(trace string) string {
	return filepath.Join(filepath.Dir(trace), "..", "fgd-expected-results", "analysis_allo_discrete.csv")
}

// LoadPublished reads the artifact's results for workload (a pod list's
// base name, e.g. openb_pod_list_default) at demand. A missing file
// yields nothing.
func LoadPublished(file, workload string, demand float64) ([]Published, error) {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open FGD results: %w", err)
	}
	defer f.Close()
	return ParsePublished(f, file, workload, demand)
}

// ParsePublished reads analysis_allo_discrete.csv: one row per workload,
// policy, tune and seed, then the allocation ratio (%) at every percent
// of arrived demand from 0 to 100 × tune. The value at demand is the
// column named round(100 × demand).
func ParsePublished(r io.Reader, name, workload string, demand float64) ([]Published, error) {
	f, err := openCSV(r, name, "workload", "sc_policy", "tune", "seed")
	if err != nil {
		return nil, err
	}
	col := strconv.Itoa(int(math.Round(100 * demand)))
	if _, ok := f.cols[col]; !ok {
		return nil, nil // the artifact did not measure this demand
	}
	sums := map[string]float64{}
	counts := map[string]int{}
	var readErr error
	for rec, line := range f.rows(&readErr) {
		if f.str(rec, "workload") != workload {
			continue
		}
		tune, err := strconv.ParseFloat(f.str(rec, "tune"), 64)
		if err != nil {
			return nil, &LineError{File: name, Line: line, Err: fmt.Errorf("tune %q is not a number", f.str(rec, "tune"))}
		}
		if tune+1e-9 < demand {
			continue // this run's demand stopped short
		}
		v, err := strconv.ParseFloat(f.str(rec, col), 64)
		if err != nil {
			return nil, &LineError{File: name, Line: line, Err: fmt.Errorf("column %s: %q is not a number", col, f.str(rec, col))}
		}
		p := f.str(rec, "sc_policy")
		sums[p] += v
		counts[p]++
	}
	if readErr != nil {
		return nil, readErr
	}
	out := make([]Published, 0, len(sums))
	for p, s := range sums {
		out = append(out, Published{Policy: p, AllocationRatio: s / float64(counts[p]) / 100, Seeds: counts[p]})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Policy < out[b].Policy })
	return out, nil
}

// Workload is a trace file's workload name as the artifact spells it.
func Workload(trace string) string {
	return strings.TrimSuffix(filepath.Base(trace), filepath.Ext(trace))
}
