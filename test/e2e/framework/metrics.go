package framework

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/test/cluster"
)

// ScrapeMetrics reads a Prometheus text endpoint and returns its samples as
// "name{labels}" → value, labels as the endpoint prints them.
func ScrapeMetrics(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return ParseMetrics(resp.Body)
}

// ParseMetrics reads Prometheus text: samples as "name{labels}" → value.
func ParseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// SchedulerBindingsInFlight is the number of kube-scheduler's binding
// cycles now running (scheduler_goroutines{operation="binding"}). A pod in
// a binding cycle holds its devices in the scheduler's memory, also after
// the pod is gone: a DRA extended-resource claim deleted before the
// scheduler's informer saw it keeps the cycle waiting for up to two minutes.
func SchedulerBindingsInFlight(ctx context.Context, c *cluster.Cluster) (float64, error) {
	body, err := c.SchedulerMetrics(ctx)
	if err != nil {
		return 0, err
	}
	m, err := ParseMetrics(bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	return m[`scheduler_goroutines{operation="binding"}`], nil
}
