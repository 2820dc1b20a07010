package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/simulate"
)

// Bad flags are refused before the cluster file is read: the one named
// here does not exist.
func TestSimulateValidatesFlags(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, tc := range []struct {
		flags []string
		err   string
	}{
		{[]string{"--seeds", "0"}, "--seeds 0: want at least 1 (how many seeds to replay and average)"},
		{[]string{"--seeds", "-2"}, "--seeds -2: want at least 1 (how many seeds to replay and average)"},
		{[]string{"--nodes-per-leaf", "0"}, "--nodes-per-leaf 0: want at least 1"},
		{[]string{"--nodes-per-leaf", "-4"}, "--nodes-per-leaf -4: want at least 1"},
		{[]string{"--leaves-per-spine", "0"}, "--leaves-per-spine 0: want at least 1"},
		{[]string{"--strategy", "packed"}, `unknown --strategy "packed": want one of consolidated, balanced, distributed`},
		{[]string{"-o", "yaml"}, `unknown output format "yaml": want one of table, json`},
		{[]string{"--limit-factor", "0.5"}, "--limit-factor 0.5: want 0 (no limits) or at least 1 (a limit never below the run time)"},
		{[]string{"--schedulers", "gputopo,fdg"}, `unknown --schedulers "fdg": want some of gputopo, default, firstfit, fgd`},
		{[]string{"--locality", "rack=2"}, `--locality: locality "rack=2": want tier=factor pairs, tiers node, leaf, spine and cross (or none)`},
		{[]string{"--seeds", "0", "--strategy", "x"}, "--seeds 0: want at least 1 (how many seeds to replay and average)\n" +
			`unknown --strategy "x": want one of consolidated, balanced, distributed`},
	} {
		_, err := run(t, "gputopo", append([]string{"simulate", "--cluster", missing, "--trace-format", "philly"}, tc.flags...)...)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if diff := cmp.Diff(tc.err, got); diff != "" {
			t.Errorf("simulate %s (-want +got):\n%s", strings.Join(tc.flags, " "), diff)
		}
	}
}

func TestSimulateRefusesWhatIsNotAClusterFile(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"job.yaml":   "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: train\n",
		"empty.yaml": "",
		"nodes.txt":  "sn,cpu_milli,memory_mib,num_gpu,model\nnode-1,96000,786432,8,V100\n",
	} {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := run(t, "gputopo", "simulate", "--cluster", file, "--trace-format", "philly")
		if !errors.Is(err, simulate.ErrNotTopology) || !strings.HasPrefix(err.Error(), "cluster file "+file+": not a cluster topology: want ") {
			t.Errorf("simulate --cluster %s: err = %v, want one naming the file and saying what a cluster file is", name, err)
		}
	}
}

// Outside the repository the demo's claims come from the binary.
func TestSimulateUsesBuiltInSpecs(t *testing.T) {
	cluster, err := filepath.Abs("../../pkg/simulate/testdata/dgx-h100-2x4x4.yaml")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	out, err := run(t, "gputopo", "simulate", "--cluster", cluster, "--trace-format", "philly", "--jobs", "20", "--seed", "1", "-o", "json")
	if err != nil {
		t.Fatalf("simulate outside the repository: %v", err)
	}
	var res struct {
		Cluster struct{ Nodes, GPUs int }
		Trace   struct{ TraceJobs int }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("simulate -o json: %v\n%s", err, out)
	}
	// 2 spines × 4 leaves × 4 nodes of 8 GPUs, and the 20 jobs asked for.
	if res.Cluster.Nodes != 32 || res.Cluster.GPUs != 256 || res.Trace.TraceJobs != 20 {
		t.Errorf("replayed %+v, want 32 nodes, 256 GPUs and 20 jobs", res)
	}
}

// The output fields the README lists are in `simulate -o json`, for
// gputopo (inline), under "baseline" (the default scheduler's model) and
// "firstFit"; perSeed has each seed's allocation and mean JCT for all
// three.
func TestSimulateOutputFields(t *testing.T) {
	out, err := run(t, "gputopo", "simulate", "--cluster", "../../pkg/simulate/testdata/dgx-h100-2x4x4.yaml",
		"--trace-format", "philly", "--jobs", "20", "--seed", "1", "--seeds", "2", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("simulate -o json: %v\n%s", err, out)
	}
	fields := []string{"allocationRatio", "milliAllocationRatio", "sameDomainRatio", "crossSpine", "fragmentation",
		"planLatencyP99Ms", "meanQueueWaitS", "p95QueueWaitS", "utilization", "usefulUtilization",
		"meanJCTS", "p95JCTS", "multiNodeMeanJCTS", "floorJCTS", "makespanS"}
	for scheduler, m := range map[string]any{"gputopo": res, "default scheduler": res["baseline"], "first fit": res["firstFit"]} {
		metrics, ok := m.(map[string]any)
		if !ok {
			t.Errorf("%s: no metrics in %s", scheduler, out)
			continue
		}
		if metrics["scheduler"] != scheduler {
			t.Errorf("scheduler %v, want %s", metrics["scheduler"], scheduler)
		}
		for _, f := range fields {
			if _, ok := metrics[f].(float64); !ok {
				t.Errorf("%s: field %s is %v, want a number", scheduler, f, metrics[f])
			}
		}
	}
	perSeed, _ := res["perSeed"].([]any)
	if len(perSeed) != 2 {
		t.Fatalf("perSeed %v, want one entry per seed of 2", res["perSeed"])
	}
	for i, s := range perSeed {
		seed, _ := s.(map[string]any)
		if seed["seed"] != float64(i+1) {
			t.Errorf("perSeed[%d].seed = %v, want %d", i, seed["seed"], i+1)
		}
		for _, k := range []string{"gputopo", "baseline", "firstFit"} {
			m, _ := seed[k].(map[string]any)
			for _, f := range []string{"allocation", "meanJCTS"} {
				if _, ok := m[f].(float64); !ok {
					t.Errorf("perSeed[%d].%s.%s is %v, want a number", i, k, f, m[f])
				}
			}
		}
	}
}

// --schedulers leaves the schedulers it does not name out of the table
// and out of each seed's --progress line, rather than showing them at 0.
func TestSimulateShowsOnlyTheSchedulersReplayed(t *testing.T) {
	out, err := run(t, "gputopo", "simulate", "--cluster", "../../pkg/simulate/testdata/dgx-h100-2x4x4.yaml",
		"--trace-format", "philly", "--jobs", "20", "--seed", "1", "--seeds", "2", "--progress", "--schedulers", "firstfit")
	if err != nil {
		t.Fatal(err)
	}
	seed := lineWith(out, "seed 1: milli-GPU allocation")
	if !strings.HasPrefix(seed, "seed 1: milli-GPU allocation first fit 0.") || strings.Contains(seed, "gputopo") || strings.Contains(seed, "default scheduler") {
		t.Errorf("progress line %q, want first fit's allocation alone", seed)
	}
	if jct := strings.SplitN(seed, "mean JCT ", 2); len(jct) != 2 || strings.Contains(jct[1], ",") {
		t.Errorf("progress line %q, want one mean JCT", seed)
	}
	if strings.Contains(out, "gputopo") || strings.Contains(out, "default scheduler") {
		t.Errorf("output names a scheduler that was not replayed:\n%s", out)
	}
}
