package simulate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Trace formats.
const (
	FormatAlibaba = "alibaba" // openb_pod_list_*.csv: one-pod jobs, no times
	FormatJobs    = "jobs"    // name,pods,gpus_per_pod[,arrival_s,duration_s]
	FormatPhilly  = "philly"  // generated, see PhillyConfig
)

// Job is one job of a trace: Pods pods of GPUsPerPod GPUs each, placed
// all together or not at all. A job of no GPUs is a pod that takes CPU
// and memory only: the default scheduler places it, whoever places GPUs.
type Job struct {
	Name       string
	Pods       int
	GPUsPerPod int
	// MilliGPU is what one pod asks for in thousandths of a GPU:
	// 1000 × GPUsPerPod unless Shared.
	MilliGPU int
	// Shared pods ask for a share of one GPU: a share of a shared GPU
	// when the cluster shares its GPUs, else a whole GPU.
	Shared bool
	// CPUMilli and MemoryMiB are what one pod asks of its node; 0 when the
	// trace does not say.
	CPUMilli, MemoryMiB int64
	// GPUModels are the GPU models the pods may use (an Alibaba pod's
	// gpu_spec); empty: any. Enforced with Options.GPUModels.
	GPUModels []string
	// Arrival and Duration are set in timed traces only; a job of a
	// timed trace leaves Duration after it was placed (stretched by the
	// locality model). Schedulers never see Duration.
	Arrival, Duration time.Duration
	// Limit is the run-time limit the job declares, as a user declares
	// one to a batch scheduler: 0 for none. EASY backfill reads it.
	Limit time.Duration
}

// GPUs is what the job requests in all, a share counting as a GPU.
func (j Job) GPUs() int { return j.Pods * j.GPUsPerPod }

// milli is what the job requests in all, in milli-GPUs.
func (j Job) milli() int64 { return int64(j.Pods * j.MilliGPU) }

// Trace is a workload to replay.
type Trace struct {
	Format string
	Source string
	Jobs   []Job // in arrival order
	// Timed traces have arrivals and durations: they replay as events,
	// with departures. Others arrive one after the other and stay.
	Timed       bool
	SharedPods  int // pods asking for a share of a GPU
	CPUOnlyPods int // pods without GPUs: jobs of GPUsPerPod 0
	ModelPods   int // pods that name the GPU models they may use
}

// LoadTrace reads a trace file. format is FormatAlibaba, FormatJobs or
// empty to tell them apart by the header (Alibaba lists num_gpu).
func LoadTrace(file, format string) (*Trace, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if format == "" {
		first, _, _ := bufio.NewReader(bytes.NewReader(data)).ReadLine()
		format = FormatJobs
		if strings.Contains(string(first), "num_gpu") {
			format = FormatAlibaba
		}
	}
	switch format {
	case FormatAlibaba:
		return ParseAlibabaPods(bytes.NewReader(data), file)
	case FormatJobs:
		return ParseJobs(bytes.NewReader(data), file)
	case FormatPhilly:
		return nil, errors.New("the philly trace is generated: it reads no file")
	}
	return nil, fmt.Errorf("unknown trace format %q: use %s, %s or %s", format, FormatAlibaba, FormatJobs, FormatPhilly)
}

// maxPodGPUs bounds a pod's GPU count; the sim profiles have at most 64.
const maxPodGPUs = 64

// ParseJobs reads the simple job CSV: name,pods,gpus_per_pod with,
// optionally, arrival_s,duration_s on every row (seconds, decimals
// allowed). A header row naming the columns may come first; '#' starts a
// comment. Timed traces are sorted by arrival, stably.
func ParseJobs(r io.Reader, name string) (*Trace, error) {
	f := newCSV(r, name, map[string]int{"name": 0, "pods": 1, "gpus_per_pod": 2, "arrival_s": 3, "duration_s": 4})
	tr := &Trace{Format: FormatJobs, Source: name}
	seen := map[string]int{}
	fields := 0
	var readErr error
	for rec, line := range f.rows(&readErr) {
		bad := func(format string, args ...any) error {
			return &LineError{File: name, Line: line, Err: fmt.Errorf(format, args...)}
		}
		if len(tr.Jobs) == 0 && fields == 0 && strings.EqualFold(strings.TrimSpace(rec[0]), "name") {
			continue // the file's own header
		}
		if len(rec) != 3 && len(rec) != 5 {
			return nil, bad("want 3 fields (name,pods,gpus_per_pod) or 5 (…,arrival_s,duration_s), got %d", len(rec))
		}
		if fields != 0 && len(rec) != fields {
			return nil, bad("%d fields, but earlier rows have %d: give arrival_s,duration_s on every row or on none", len(rec), fields)
		}
		fields = len(rec)
		j := Job{Name: strings.TrimSpace(rec[0])}
		var err error
		if j.Name == "" {
			return nil, bad("name is empty")
		}
		if prev, dup := seen[j.Name]; dup {
			return nil, bad("job %s is listed twice (first on line %d)", j.Name, prev)
		}
		seen[j.Name] = line
		if j.Pods, err = f.int(rec, "pods", 1, 100000); err != nil {
			return nil, bad("%v", err)
		}
		if j.GPUsPerPod, err = f.int(rec, "gpus_per_pod", 1, maxPodGPUs); err != nil {
			return nil, bad("%v", err)
		}
		j.MilliGPU = 1000 * j.GPUsPerPod
		if fields == 5 {
			tr.Timed = true
			if j.Arrival, err = seconds(rec[3], "arrival_s", false); err != nil {
				return nil, bad("%v", err)
			}
			if j.Duration, err = seconds(rec[4], "duration_s", true); err != nil {
				return nil, bad("%v", err)
			}
		}
		tr.Jobs = append(tr.Jobs, j)
	}
	if readErr != nil {
		return nil, readErr
	}
	if len(tr.Jobs) == 0 {
		return nil, fmt.Errorf("%s lists no job", name)
	}
	if tr.Timed {
		sort.SliceStable(tr.Jobs, func(a, b int) bool { return tr.Jobs[a].Arrival < tr.Jobs[b].Arrival })
	}
	return tr, nil
}

func seconds(s, col string, positive bool) (time.Duration, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s %q is not a number of seconds", col, s)
	}
	if v < 0 || (positive && v == 0) || v > 1e9 {
		return 0, fmt.Errorf("%s %v is out of range: want %s seconds up to 1e9", col, v, map[bool]string{true: "more than 0", false: "0 or more"}[positive])
	}
	return time.Duration(v * float64(time.Second)), nil
}

// PhillyConfig generates a Philly-like timed trace: single-pod jobs of
// 1/2/4/8 GPUs in the 70/10/15/5 % mix of Gavel's Philly-derived sampler,
// and a MultiNodeFraction of jobs of 2–8 pods of 8 GPUs (16–64 GPUs).
// Durations are log-normal (median 30 min, σ 1.5, 1 min to 7 days) and
// arrivals Poisson, at the rate that makes the offered load (GPU-seconds
// asked per second) Load times the cluster's GPUs.
type PhillyConfig struct {
	Jobs              int
	MultiNodeFraction float64
	Load              float64
	ClusterGPUs       int
}

// DefaultPhilly is 1,000 jobs, 10 % of them multi-node, at load 1.3.
func DefaultPhilly(clusterGPUs int) PhillyConfig {
	return PhillyConfig{Jobs: 1000, MultiNodeFraction: 0.1, Load: 1.3, ClusterGPUs: clusterGPUs}
}

// GeneratePhilly makes the trace for seed.
func GeneratePhilly(cfg PhillyConfig, seed uint64) (*Trace, error) {
	switch {
	case cfg.Jobs < 1:
		return nil, fmt.Errorf("philly trace: jobs must be at least 1, got %d", cfg.Jobs)
	case cfg.MultiNodeFraction < 0 || cfg.MultiNodeFraction > 1:
		return nil, fmt.Errorf("philly trace: the multi-node fraction must be in [0,1], got %v", cfg.MultiNodeFraction)
	case cfg.Load <= 0 || cfg.ClusterGPUs < 1:
		return nil, fmt.Errorf("philly trace: load (%v) and cluster GPUs (%d) must be positive", cfg.Load, cfg.ClusterGPUs)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	tr := &Trace{Format: FormatPhilly, Source: fmt.Sprintf("philly(jobs=%d,multinode=%.2f,load=%.2f,seed=%d)", cfg.Jobs, cfg.MultiNodeFraction, cfg.Load, seed), Timed: true}
	gpuSeconds := 0.0
	for i := range cfg.Jobs {
		j := Job{Name: fmt.Sprintf("philly-%d", i), Pods: 1}
		if rng.Float64() < cfg.MultiNodeFraction {
			j.Pods, j.GPUsPerPod = 2+rng.IntN(7), 8
		} else {
			switch u := rng.Float64(); {
			case u < 0.70:
				j.GPUsPerPod = 1
			case u < 0.80:
				j.GPUsPerPod = 2
			case u < 0.95:
				j.GPUsPerPod = 4
			default:
				j.GPUsPerPod = 8
			}
		}
		j.MilliGPU = 1000 * j.GPUsPerPod
		d := math.Exp(math.Log(1800) + 1.5*rng.NormFloat64())
		d = min(max(d, 60), 7*24*3600)
		j.Duration = time.Duration(d * float64(time.Second))
		gpuSeconds += d * float64(j.GPUs())
		tr.Jobs = append(tr.Jobs, j)
	}
	span := gpuSeconds / (cfg.Load * float64(cfg.ClusterGPUs))
	mean := span / float64(cfg.Jobs)
	t := 0.0
	for i := range tr.Jobs {
		tr.Jobs[i].Arrival = time.Duration(t * float64(time.Second))
		t += rng.ExpFloat64() * mean
	}
	return tr, nil
}
