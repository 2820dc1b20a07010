package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// The gRPC health services the plugin's probe server answers for: the
// chart's startupProbe asks ProbeStartup, its livenessProbe
// ProbeLiveness; both are SERVING once the kubelet registered the plugin
// and the DRA socket answers.
const (
	ProbeLiveness = "liveness"
	ProbeStartup  = "startup"
)

// DRASocket is the DRA gRPC socket's name in the plugin directory (the
// kubelet plugin helper's default).
const DRASocket = "dra.sock"

// probeServer answers gRPC health checks (Kubernetes' grpc probes).
type probeServer struct {
	healthpb.UnimplementedHealthServer

	mu sync.Mutex
	// registration is the kubelet plugin helper's RegistrationStatus,
	// nil until the helper has started.
	registration func() *registerapi.RegistrationStatus
	draSocket    string
}

// setHelper makes the probes look at a started helper.
func (p *probeServer) setHelper(registration func() *registerapi.RegistrationStatus, draSocket string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.registration, p.draSocket = registration, draSocket
}

// Check implements healthpb.HealthServer.
func (p *probeServer) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	switch req.GetService() {
	case "", ProbeLiveness, ProbeStartup:
	default:
		return nil, status.Errorf(codes.NotFound, "unknown service %q: ask %q or %q", req.GetService(), ProbeLiveness, ProbeStartup)
	}
	if err := p.serving(ctx); err != nil {
		klog.FromContext(ctx).V(2).Info("Health probe: not serving", "service", req.GetService(), "reason", err)
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// serving says why the plugin is not serving the kubelet, or nil.
func (p *probeServer) serving(ctx context.Context) error {
	p.mu.Lock()
	registration, socket := p.registration, p.draSocket
	p.mu.Unlock()
	if registration == nil {
		return errors.New("starting: the kubelet plugin helper is not running yet")
	}
	st := registration()
	switch {
	case st == nil:
		return errors.New("the kubelet has not registered the plugin yet")
	case !st.PluginRegistered:
		return fmt.Errorf("the kubelet refused the plugin's registration: %s", st.Error)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to the DRA socket %s: %w", socket, err)
	}
	defer func() { _ = conn.Close() }()
	// An empty request prepares nothing; an answer shows the DRA
	// service is alive.
	if _, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
		return fmt.Errorf("the DRA socket %s does not answer: %w", socket, err)
	}
	return nil
}

// serveProbes answers health probes on addr until ctx is done; the
// returned function stops the server. An empty addr serves nothing.
func serveProbes(ctx context.Context, addr string, p *probeServer) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for health probes on %s (--health-probe-address): %w", addr, err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, p)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil {
			klog.FromContext(ctx).Error(err, "Health probe server stopped", "address", addr)
		}
	}()
	return func() {
		srv.Stop()
		<-done
	}, nil
}

// draSocketPath is where the helper serves the DRA service.
func draSocketPath(pluginDir string) string { return filepath.Join(pluginDir, DRASocket) }
