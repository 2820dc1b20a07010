package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/client-go/rest"
)

// SchedulerMetrics reads kube-scheduler's /metrics (Prometheus text). The
// scheduler serves a self-signed certificate; the request authenticates
// with the cluster's admin client certificate, which is what its
// delegated authorization checks.
func (c *Cluster) SchedulerMetrics(ctx context.Context) ([]byte, error) {
	ports := c.ports
	if ports.Scheduler == 0 {
		info, err := ReadReady(c.dir)
		if err != nil {
			return nil, err
		}
		ports = info.Ports
	}
	tlsCfg, err := rest.TLSConfigFor(c.RESTConfig())
	if err != nil {
		return nil, fmt.Errorf("client TLS configuration: %w", err)
	}
	tlsCfg = tlsCfg.Clone()
	tlsCfg.InsecureSkipVerify = true //nolint:gosec // the local cluster's own scheduler on 127.0.0.1
	tlsCfg.RootCAs = nil
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	url := fmt.Sprintf("https://127.0.0.1:%d/metrics", ports.Scheduler)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape kube-scheduler metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape kube-scheduler metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return body, nil
}
