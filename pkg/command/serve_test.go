package command_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gputopo/gputopo/pkg/command"
)

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// get waits for the server to listen and returns the status of a GET.
func get(t *testing.T, url string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(url) //nolint:noctx // test
		if err == nil {
			_ = resp.Body.Close()
			return resp.StatusCode
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestServeMetricsProfilingOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		prof      command.Profiling
		pprofCode int
	}{
		{command.Profiling{}, http.StatusNotFound},
		{command.Profiling{Enabled: true}, http.StatusOK},
	} {
		t.Run(fmt.Sprintf("profiling=%v", tc.prof.Enabled), func(t *testing.T) {
			addr := freeAddr(t)
			reg := prometheus.NewRegistry()
			reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "gputopo_test_total", Help: "test"}))
			stop := command.ServeMetrics(context.Background(), addr, reg, tc.prof, nil)
			defer stop()
			if code := get(t, "http://"+addr+"/metrics"); code != http.StatusOK {
				t.Errorf("/metrics: status %d, want 200", code)
			}
			if code := get(t, "http://"+addr+"/debug/pprof/goroutine?debug=1"); code != tc.pprofCode {
				t.Errorf("/debug/pprof/goroutine: status %d, want %d", code, tc.pprofCode)
			}
		})
	}
}

func TestContentionProfilingNeedsProfiling(t *testing.T) {
	err := command.Profiling{Contention: true}.Validate()
	if err == nil || !strings.Contains(err.Error(), "--profiling") {
		t.Fatalf("Validate() = %v, want an error naming --profiling", err)
	}
	if err := (command.Profiling{Enabled: true, Contention: true}).Validate(); err != nil {
		t.Fatalf("Validate() with both = %v", err)
	}
}

// /readyz answers what the Readiness says: 503 until ready, the status as
// the body; without a Readiness it is not served.
func TestServeMetricsReadyz(t *testing.T) {
	addr := freeAddr(t)
	var ready atomic.Bool
	stop := command.ServeMetrics(context.Background(), addr, prometheus.NewRegistry(), command.Profiling{}, func() (bool, string) {
		if ready.Load() {
			return true, "ok"
		}
		return false, "syncing"
	})
	defer stop()
	body := func() (int, string) {
		code := get(t, "http://"+addr+"/readyz")
		resp, err := http.Get("http://" + addr + "/readyz") //nolint:noctx // test
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return code, strings.TrimSpace(string(b))
	}
	if code, b := body(); code != http.StatusServiceUnavailable || b != "syncing" {
		t.Errorf("before ready: %d %q, want 503 \"syncing\"", code, b)
	}
	ready.Store(true)
	if code, b := body(); code != http.StatusOK || b != "ok" {
		t.Errorf("once ready: %d %q, want 200 \"ok\"", code, b)
	}

	none := freeAddr(t)
	defer command.ServeMetrics(context.Background(), none, prometheus.NewRegistry(), command.Profiling{}, nil)()
	if code := get(t, "http://"+none+"/readyz"); code != http.StatusNotFound {
		t.Errorf("without a Readiness: /readyz answers %d, want 404", code)
	}
}
