package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

func TestParseShape(t *testing.T) {
	if s, err := ParseShape("16x8"); err != nil || s != (Shape{Pods: 16, GPUs: 8}) {
		t.Errorf("ParseShape(16x8) = %v, %v", s, err)
	}
	for in, wantErr := range map[string]string{"16": "PODSxGPUS", "0x8": "PODSxGPUS", "2x3": "1, 2, 4 or 8", "x8": "PODSxGPUS"} {
		if _, err := ParseShape(in); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("ParseShape(%q) = %v, want an error saying %q", in, err, wantErr)
		}
	}
}

func TestSummarizeJobs(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	job := func(name string, pods, bound int, created, done float64) *jobInfo {
		j := &jobInfo{name: name, shape: Shape{Pods: pods, GPUs: 8}, created: at(created), bound: map[string]bool{}}
		for i := range bound {
			j.bound[name+"-"+string(rune('a'+i))] = true
		}
		if done > 0 {
			j.done = at(done)
		}
		return j
	}
	jobs := []*jobInfo{
		job("big", 16, 16, 0.1, 30), // overtaken by the two small ones
		job("small-1", 2, 2, 0.2, 5),
		job("small-2", 2, 2, 0.3, 6),
		job("stuck", 4, 1, 0.4, 0),
	}
	// small-1 ran elsewhere; small-2 took node n-3 at 6 s, which big got in
	// the end, so big waited 24 s for room a later Job took.
	jobs[0].nodes = map[string]time.Time{"n-1": at(29), "n-2": at(29.5), "n-3": at(30)}
	jobs[1].nodes = map[string]time.Time{"n-9": at(5)}
	jobs[2].nodes = map[string]time.Time{"n-3": at(6)}
	var res ControllerResult
	summarizeJobs(&res, jobs, t0)
	got := res
	want := ControllerResult{
		JobsBound: 3, PodsBound: 21, AllBoundSeconds: 30,
		WaitP50: 5.7, WaitP99: 29.9, WaitMax: 29.9, WaitMaxJob: "big",
		MaxOvertaken: 2, MaxOvertakenJob: "big",
		// big waited from small-1's bind at 5 s to its own at 30 s.
		MaxBehind: 25, MaxBehindJob: "big",
		MaxBehindOnItsNodes: 24, MaxBehindOnItsNodesJob: "big",
		WaitMaxByShape: map[string]float64{"16x8": 29.9, "2x8": 5.7},
		Unbound:        map[string]int{"4x8": 1},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
		t.Errorf("summarizeJobs (-want +got):\n%s", diff)
	}
}

func TestCountAuditWrites(t *testing.T) {
	log := `{"kind":"Event","stage":"ResponseComplete","verb":"create","userAgent":"kube-controller-manager/v1.37.1 (linux/amd64) kubernetes/abc/system:serviceaccount:kube-system:job-controller","user":{"username":"system:serviceaccount:kube-system:job-controller"},"objectRef":{"resource":"pods","namespace":"b"},"requestReceivedTimestamp":"2026-01-01T00:00:01.000000Z"}
{"kind":"Event","stage":"ResponseComplete","verb":"patch","userAgent":"gputopo-controller/v0.0.0 (linux/amd64) kubernetes/$Format","user":{"username":"kubernetes-admin"},"objectRef":{"resource":"pods","subresource":"status","namespace":"b"},"requestReceivedTimestamp":"2026-01-01T00:00:02.000000Z"}
{"kind":"Event","stage":"ResponseComplete","verb":"patch","userAgent":"gputopo-controller/v0.0.0 (linux/amd64) kubernetes/$Format","user":{"username":"kubernetes-admin"},"objectRef":{"resource":"pods","subresource":"status","namespace":"b"},"requestReceivedTimestamp":"2026-01-01T00:00:03.000000Z"}
{"kind":"Event","stage":"ResponseComplete","verb":"create","userAgent":"kube-scheduler/v1.37.1","user":{"username":"system:kube-scheduler"},"objectRef":{"resource":"pods","subresource":"binding"},"requestReceivedTimestamp":"2026-01-01T00:00:09.000000Z"}
{"kind":"Event","stage":"ResponseComplete","verb":"create","userAgent":"benchscale/v0.0.0","user":{"username":"kubernetes-admin"},"objectRef":{"resource":"jobs"},"requestReceivedTimestamp":"2025-12-31T23:59:59.000000Z"}
`
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	got, err := CountAuditWrites(path, t0, t0.Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]int{
		"kube-controller-manager job-controller": {"create pods": 1},
		"gputopo-controller":                     {"patch pods/status": 2},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CountAuditWrites (-want +got):\n%s", diff)
	}
	if err := os.WriteFile(path, []byte("not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := CountAuditWrites(path, t0, t0); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("CountAuditWrites(garbage) = %v, want an error naming line 1", err)
	}
}

func TestPodStages(t *testing.T) {
	ev := func(sec int, verb, ua, user, res, sub, ns, name string, code int) string {
		return fmt.Sprintf(`{"stage":"ResponseComplete","verb":%q,"userAgent":%q,"user":{"username":%q},"objectRef":{"resource":%q,"subresource":%q,"namespace":%q,"name":%q},"responseStatus":{"code":%d},"requestReceivedTimestamp":"2026-01-01T00:00:%02d.000000Z"}`+"\n",
			verb, ua, user, res, sub, ns, name, code, sec)
	}
	const (
		claimCtl = "system:serviceaccount:kube-system:resource-claim-controller"
		kcm      = "kube-controller-manager/v1.37.1"
		ctl      = "gputopo-controller/v0.0.0"
	)
	log := ev(1, "create", "benchscale/v0.0.0", "admin", "jobs", "", "b", "job-0001-2x8", 201) +
		ev(3, "patch", kcm, claimCtl, "pods", "status", "b", "job-0001-2x8-0-abcde", 200) +
		ev(4, "patch", kcm, claimCtl, "pods", "status", "b", "job-0001-2x8-1-fghij", 200) +
		ev(5, "patch", ctl, "admin", "pods", "", "b", "job-0001-2x8-0-abcde", 200) + // waiting: an annotation
		ev(6, "patch", ctl, "admin", "pods", "status", "b", "job-0001-2x8-0-abcde", 200) +
		ev(7, "patch", ctl, "admin", "pods", "", "b", "job-0001-2x8-0-abcde", 200) + // the gate
		ev(7, "patch", ctl, "admin", "pods", "", "b", "job-0001-2x8-1-fghij", 200) +
		ev(8, "create", "kube-scheduler/v1.37.1", "system:kube-scheduler", "pods", "binding", "b", "job-0001-2x8-0-abcde", 409) +
		ev(9, "create", "kube-scheduler/v1.37.1", "system:kube-scheduler", "pods", "binding", "b", "job-0001-2x8-0-abcde", 201) +
		ev(10, "create", "kube-scheduler/v1.37.1", "system:kube-scheduler", "pods", "binding", "b", "job-0001-2x8-1-fghij", 201) +
		ev(11, "patch", ctl, "admin", "pods", "", "b", "job-0001-2x8-1-fghij", 200) + // after binding: not the gate
		ev(12, "patch", kcm, claimCtl, "pods", "status", "b", "job-0002-1x1-0-zzzzz", 200) + // never bound
		ev(13, "create", "benchscale/v0.0.0", "admin", "jobs", "", "c", "job-0003-1x1", 201) +
		ev(15, "patch", kcm, claimCtl, "pods", "status", "c", "job-0003-1x1-0-aaaaa", 200) +
		ev(16, "create", "kube-scheduler/v1.37.1", "system:kube-scheduler", "pods", "binding", "c", "job-0003-1x1-0-aaaaa", 201) + // count-only: no gate
		ev(17, "create", "benchscale/v0.0.0", "admin", "jobs", "", "d", "job-0004-1x1", 201) +
		ev(20, "create", "kube-scheduler/v1.37.1", "system:kube-scheduler", "pods", "binding", "d", "job-0004-1x1-0-bbbbb", 201) // no claims
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	got, err := PodStages(path, t0, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// Nearest rank, as the Job waits: of three, the 90th percentile is the
	// third; of two, the median is the first.
	want := []StageSummary{
		{Stage: StageClaims, Pods: 3, P50: 2, P90: 3, P99: 3, Max: 3},
		{Stage: StageGate, Pods: 2, P50: 3, P90: 4, P99: 4, Max: 4},
		{Stage: StageBind, Pods: 2, P50: 2, P90: 3, P99: 3, Max: 3},
		{Stage: StageBindNoGate, Pods: 1, P50: 1, P90: 1, P99: 1, Max: 1},
		{Stage: StageBindNoClaims, Pods: 1, P50: 3, P90: 3, P99: 3, Max: 3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PodStages (-want +got):\n%s", diff)
	}
}

func TestReadProcOfThisProcess(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "run", "self.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+" 12345\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := ClusterProc(dir, "self")
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != os.Getpid() || s.RSS == 0 || s.PeakRSS < s.RSS {
		t.Errorf("ClusterProc(self) = %+v, want this pid with RSS > 0 and peak >= RSS", s)
	}
	if _, err := ClusterProc(dir, "absent"); err == nil {
		t.Error("ClusterProc of a process without a pid file succeeded")
	}
	if got := Memory(dir, "self", "absent"); len(got) != 1 || got[0].Name != "self" {
		t.Errorf("Memory(self, absent) = %+v, want only self", got)
	}
}

func TestBurstPathsJobs(t *testing.T) {
	for _, path := range BurstPaths {
		tmpls, err := pathTemplates(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for gpus := range ShapeTemplates {
			tmpl := tmpls[gpus]
			if (tmpl == nil) != (path == PathNoClaims) {
				t.Fatalf("%s: template for %d GPUs is %v", path, gpus, tmpl)
			}
			if tmpl != nil {
				if got, err := ClaimGPUs(tmpl); err != nil || got != gpus {
					t.Errorf("%s: template %s asks for %d GPUs (%v), want %d", path, tmpl.Name, got, err, gpus)
				}
				d := tmpl.Spec.Spec.Devices
				if path == PathCountOnly && (len(d.Constraints) > 0 || len(d.Requests[0].Exactly.Selectors) > 0) {
					t.Errorf("%s: template %s has a selector or a constraint", path, tmpl.Name)
				}
			}
			job := newJob("j", Shape{Pods: 2, GPUs: gpus}, path == PathGputopo, tmpl)
			pod := job.Spec.Template
			_, handed := pod.Annotations[placement.AnnotationPlacement]
			if handed != (path == PathGputopo) {
				t.Errorf("%s: pod template handed to gputopo: %v", path, handed)
			}
			if n := len(pod.Spec.ResourceClaims); n != map[bool]int{true: 0, false: 1}[path == PathNoClaims] {
				t.Errorf("%s: pod template has %d claims", path, n)
			}
		}
	}
	if _, err := pathTemplates("gang"); err == nil || !strings.Contains(err.Error(), PathCountOnly) {
		t.Errorf("pathTemplates(gang) = %v, want an error listing the paths", err)
	}
}
