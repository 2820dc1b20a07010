package cluster

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNeedsFor(t *testing.T) {
	// Two clusters of 8 kubelets exhausted 128 instances: 16 kubelets must
	// need more than that.
	if got := NeedsFor(16, 64).InotifyInstances; got <= 128 {
		t.Errorf("16 kubelets need %d inotify instances, want more than the 128 they exhausted", got)
	}
	a, b := NeedsFor(2, 34), NeedsFor(8, 34)
	if b.InotifyInstances <= a.InotifyInstances || b.InotifyWatches <= a.InotifyWatches {
		t.Errorf("needs do not grow with kubelets: 2 → %+v, 8 → %+v", a, b)
	}
	if c := NeedsFor(2, 1000); c.OpenFiles <= a.OpenFiles {
		t.Errorf("open files do not grow with nodes: 34 → %d, 1000 → %d", a.OpenFiles, c.OpenFiles)
	}
	if b.OpenFiles <= a.OpenFiles {
		t.Errorf("open files do not grow with kubelets: 2 → %d, 8 → %d", a.OpenFiles, b.OpenFiles)
	}
	// The scale benchmarks' 5,000 fake nodes ran under the usual hard
	// limit of 20,000 open files.
	if d := NeedsFor(3, 5000); d.OpenFiles > 20000 {
		t.Errorf("5,000 nodes (3 real) need %d open files, more than the 20,000 they ran under", d.OpenFiles)
	}
}

func TestPlanLimits(t *testing.T) {
	type fix struct {
		Name string
		Want uint64
	}
	roomy := HostLimits{InotifyInstances: 1024, InotifyWatches: 1 << 20, OpenFiles: 1 << 16, OpenFilesHard: 1 << 20}
	needs := HostNeeds{InotifyInstances: 100, InotifyWatches: 20000, OpenFiles: 8192}
	for name, tc := range map[string]struct {
		have        HostLimits
		root        bool
		raise, hand []fix
	}{
		"enough": {have: roomy},
		"instances used by others count": {
			have: func() HostLimits { h := roomy; h.InotifyInstances, h.InotifyInstancesUsed = 128, 60; return h }(),
			root: true, raise: []fix{{"fs.inotify.max_user_instances", 256}},
		},
		"sysctls need root": {
			have: func() HostLimits {
				h := roomy
				h.InotifyInstances, h.InotifyInstancesUsed, h.InotifyWatches = 256, 200, 8192
				return h
			}(),
			hand: []fix{{"fs.inotify.max_user_instances", 512}, {"fs.inotify.max_user_watches", 32768}},
		},
		"soft open files up to the hard limit without root": {
			have:  func() HostLimits { h := roomy; h.OpenFiles, h.OpenFilesHard = 1024, 1<<20; return h }(),
			raise: []fix{{"open files (ulimit -n)", 8192}},
		},
		"open files above the hard limit need root": {
			have: func() HostLimits { h := roomy; h.OpenFiles, h.OpenFilesHard = 1024, 4096; return h }(),
			hand: []fix{{"open files (ulimit -n)", 8192}},
		},
		"root raises open files above the hard limit": {
			have:  func() HostLimits { h := roomy; h.OpenFiles, h.OpenFilesHard = 1024, 4096; return h }(),
			root:  true,
			raise: []fix{{"open files (ulimit -n)", 8192}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			raise, manual := PlanLimits(tc.have, needs, tc.root)
			project := func(fs []LimitFix) []fix {
				var out []fix
				for _, f := range fs {
					out = append(out, fix{f.Name, f.Want})
				}
				return out
			}
			if diff := cmp.Diff(tc.raise, project(raise)); diff != "" {
				t.Errorf("raised (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.hand, project(manual)); diff != "" {
				t.Errorf("left to a person (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLimitsErrorSaysWhatToRun(t *testing.T) {
	_, manual := PlanLimits(HostLimits{InotifyInstances: 128, InotifyInstancesUsed: 100, InotifyWatches: 8192, OpenFiles: 1024, OpenFilesHard: 1024},
		NeedsFor(16, 64), false)
	msg := (&LimitsError{Fixes: manual}).Error()
	for _, want := range []string{
		"fs.inotify.max_user_instances is 128, needs 512: sudo sysctl -w fs.inotify.max_user_instances=512",
		"fs.inotify.max_user_watches is 8192, needs 16384: sudo sysctl -w fs.inotify.max_user_watches=16384",
		fmt.Sprintf("open files (ulimit -n) is 1024, needs %[1]d: ulimit -n %[1]d", NeedsFor(16, 64).OpenFiles),
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not say %q:\n%s", want, msg)
		}
	}
}
