package scale

import (
	"bytes"
	"context"
	"io"
	"runtime"
	rtrace "runtime/trace"
	"strings"
	"testing"
	"time"
)

// spin keeps its goroutine on a CPU for d.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

// A region's time is split by what its goroutine did: computing, waiting
// for a P while another goroutine of the process held it, or blocked.
func TestReadTraceRegions(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var buf bytes.Buffer
	if err := rtrace.Start(&buf); err != nil {
		t.Skipf("tracing is on already (go test -trace): %v", err)
	}
	ctx := context.Background()
	rtrace.WithRegion(ctx, "compute", func() { spin(40 * time.Millisecond) })
	rtrace.WithRegion(ctx, "compute", func() { spin(time.Millisecond) })
	rtrace.WithRegion(ctx, "sleep", func() { time.Sleep(40 * time.Millisecond) })
	// With one P, a second goroutine computing takes turns with the
	// region's: the scheduler preempts each every 10 ms.
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				spin(time.Millisecond)
			}
		}
	}()
	rtrace.WithRegion(ctx, "shared", func() { spin(60 * time.Millisecond) })
	close(stop)
	rtrace.Stop()
	open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil }

	all, long, err := ReadTraceRegions(open, "compute", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if all.Count != 2 || all.Long != 1 || len(long) != 1 {
		t.Fatalf("compute: %d regions, %d long, %d detailed; want 2, 1, 1", all.Count, all.Long, len(long))
	}
	if r := long[0]; r.Running < r.Took*8/10 || r.Blocked > r.Took/10 {
		t.Errorf("compute region: running %s, blocked %s of %s; want nearly all running", r.Running, r.Blocked, r.Took)
	}

	_, long, err = ReadTraceRegions(open, "sleep", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(long) != 1 || long[0].Blocked < long[0].Took*8/10 || long[0].Running > long[0].Took/10 {
		t.Errorf("sleep region: %+v; want nearly all blocked", long)
	}

	_, long, err = ReadTraceRegions(open, "shared", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(long) != 1 {
		t.Fatalf("shared: %d long regions, want 1", len(long))
	}
	// With one P, the region's goroutine waits exactly while the other
	// runs; how often the scheduler switches them depends on the load.
	if r := long[0]; r.Runnable == 0 || (r.Runnable-r.Others).Abs() > time.Millisecond || r.Running+r.Runnable < r.Took*95/100 {
		t.Errorf("shared region: running %s, runnable %s, blocked %s, others ran %s of %s; want it runnable while the other goroutine ran, and nothing left uncounted", r.Running, r.Runnable, r.Blocked, r.Others, r.Took)
	}

	if _, long, err := ReadTraceRegions(open, "absent", 0); err != nil || long != nil {
		t.Errorf("absent region type: %v, %v; want none and no error", long, err)
	}
	if _, _, err := ReadTraceRegions(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader([]byte("not a trace"))), nil }, "compute", 0); err == nil {
		t.Error("a file that is not a trace was read without an error")
	}
}

// The report says how much of the slowest plans was spent off a CPU.
func TestReportSlowPlanner(t *testing.T) {
	var b bytes.Buffer
	WriteController(&b, "burst", ControllerResult{
		Planner: RegionStats{Count: 1000, Long: 15, Took: 4076 * time.Millisecond, Samples: 243},
		SlowPlanner: []TraceRegion{{Type: "planner", Start: 50 * time.Second, Took: 51900 * time.Microsecond,
			Running: 41500 * time.Microsecond, Runnable: 10400 * time.Microsecond, Others: 59700 * time.Microsecond, Samples: 1, ProcessSamples: 1}},
	})
	out := b.String()
	for _, want := range []string{
		"1000 planner regions, 4.076s in all, 243 CPU samples of the planning goroutine inside them (about 2430 ms of CPU); 15 of 25ms or more",
		"| 51.9 ms | 50.0 s | 41.5 | 10.4 | 0.0 | 0.0 / 0.0 / 0.0 | 59.7 | 1 / 1 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	WriteController(&b, "burst", ControllerResult{})
	if strings.Contains(b.String(), "planner regions") {
		t.Errorf("report without a trace speaks of planner regions:\n%s", b.String())
	}
}
